"""The KV cache's stored format (kernels/kv_format.py), K and V settable apart (llama.cpp's -ctk / -ctv).

The pool, the disk tier (its fingerprint names the formats), the document store and its disk copy
all hold KV in these formats; the pool is sized in bytes, so a smaller format holds more tokens.
Pure Python (no torch): the flags are built without loading the engine.
"""

from dataclasses import dataclass

from engine.setting import setting

# kernels.kv_format.KV_DTYPES (tests/kernels/test_kv_formats.py checks they agree): the flags' choices
KV_DTYPE_CHOICES = ("float32", "bfloat16", "int8")
# kernels.kv_format.UNOFFERED_KV_DTYPES: float8 (e4m3, the torch backend's only) missed the bar of top-1 >= 0.98
# against float32 KV (docs/performance.md), so no flag offers it; an engine built directly takes it (the
# quality bench measures it there)
UNOFFERED_KV_DTYPES = ("float8",)
AUTO = "auto"  # the model's own dtype, stored as is


@dataclass(frozen=True)
class KVDtypeConfig:
    # bfloat16 passed the 0.99 a default needs over 200 prompts (0.9973 reuse off, 0.9979 on, like with like;
    # docs/performance.md) and is no slower, but it stays opt-in: a quantized format turns the float-rounding
    # difference between a cold prefill's rows and the same rows after a prefix hit into a step of its own
    # rounding, so a served answer repeats less reliably (README, "KV pages can be kept smaller")
    kv_dtype: str = setting(
        AUTO, "how K and V are stored: float32, bfloat16 (half float32's bytes) or int8 (per token and head, with a "
        "float32 scale: about 3.8x the tokens of float32 in the same --kv-cache-memory); auto: the model's dtype",
        choices=(AUTO, *KV_DTYPE_CHOICES))
    kv_dtype_k: str | None = setting(None, "K's format, overriding --kv-dtype for K", choices=KV_DTYPE_CHOICES)
    kv_dtype_v: str | None = setting(None, "V's format, overriding --kv-dtype for V", choices=KV_DTYPE_CHOICES)

    def __post_init__(self):
        known = (*KV_DTYPE_CHOICES, *UNOFFERED_KV_DTYPES)
        if self.kv_dtype not in (AUTO, *known):
            raise ValueError(f"kv_dtype must be one of {AUTO}, {', '.join(known)}, got {self.kv_dtype!r}")
        for name in ("kv_dtype_k", "kv_dtype_v"):
            value = getattr(self, name)
            if value is not None and value not in known:
                raise ValueError(f"{name} must be one of {', '.join(known)}, got {value!r}")

    def resolve(self, model_kv_dtype: str) -> tuple[str, str]:
        """(K's format, V's format), `model_kv_dtype` (the model dtype's own format) standing for auto."""
        both = model_kv_dtype if self.kv_dtype == AUTO else self.kv_dtype
        return self.kv_dtype_k or both, self.kv_dtype_v or both

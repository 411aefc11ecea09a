"""The model's shape, read from an HF-style `config.json`: one set of facts for every family.

What differs between the families is stated here as data the math reads (model/decoder.py):
q/k norms, GeGLU, Gemma's (1 + w) norms and sandwich norms, embedding scaling, soft caps,
sliding-window layers and their own RoPE, partial rotary dimensions, longrope. Both config
dialects are read: transformers 4.x (`rope_theta`, `rope_scaling`, `rope_local_base_freq`,
`sliding_window_pattern`) and 5.x (`rope_parameters`, per layer type for Gemma 3; `layer_types`).
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

from kernels.rotary import rope_inv_freq
from store.errors import ModelFormatError

# Architecture -> family. Llama covers Llama 2/3.x and SmolLM; Mistral is Llama with windows.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
HIDDEN_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    has_qkv_bias: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    hidden_act: str = "silu"  # the MLP's gate: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    has_qk_norm: bool = False  # RMSNorm over each q and k head before RoPE (Qwen3, Gemma 3)
    norm_adds_one: bool = False  # the checkpoint's norm weights w scale by (1 + w) (Gemma); folded at load
    has_sandwich_norms: bool = False  # norms of the attention and MLP outputs before their adds (Gemma 2/3)
    embedding_multiplier: float = 1.0  # the embedding rows are scaled by this (Gemma: sqrt(hidden_size))
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (Gemma); None: head_dim
    attn_logit_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_logit_softcap: float | None = None  # logits likewise (Gemma 2)
    # Per layer: its sliding window W (a query sees the keys less than W positions behind it), or None
    # for a global layer. Empty: every layer global.
    layer_windows: tuple[int | None, ...] = ()
    # RoPE of the sliding-window layers when it differs from the global layers' (Gemma 3's local base).
    sliding_rope_theta: float | None = None
    sliding_rope_scaling: dict | None = None
    partial_rotary_factor: float = 1.0  # the leading fraction of a head that rotates (Phi-3/4)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"hidden_act must be silu or gelu_tanh, got {self.hidden_act!r}")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError(f"layer_windows has {len(self.layer_windows)} entries for {self.num_layers} layers")
        if any(window is not None and window < 1 for window in self.layer_windows):
            raise ValueError(f"sliding windows must be >= 1, got {self.layer_windows}")
        rotary_dim = self.rotary_dim
        if not 0 < rotary_dim <= self.head_dim or rotary_dim % 2:
            raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor} gives {rotary_dim} rotary "
                             f"dimensions of {self.head_dim}: need an even number in (0, head_dim]")

    @property
    def family(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def window_of(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    def uses_sliding_rope(self, layer: int) -> bool:
        return self.sliding_rope_theta is not None and self.window_of(layer) is not None

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "ModelConfig":
        architectures = raw.get("architectures") or []
        architecture = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
        if architecture is None:
            raise ModelFormatError(
                source,
                f"unsupported architecture {architectures or raw.get('model_type')!r}; "
                f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}",
            )
        try:
            return cls._from_dict(raw, architecture)
        except (KeyError, TypeError, ValueError) as error:
            raise ModelFormatError(source, f"bad model config: {error!r}") from None

    @classmethod
    def _from_dict(cls, raw: dict, architecture: str) -> "ModelConfig":
        family = SUPPORTED_ARCHITECTURES[architecture]
        is_gemma = family in ("gemma2", "gemma3")
        num_heads = int(raw["num_attention_heads"])
        hidden_size = int(raw["hidden_size"])
        num_layers = int(raw["num_hidden_layers"])
        head_dim = int(raw.get("head_dim") or hidden_size // num_heads)
        max_positions = int(raw.get("max_position_embeddings", 2048))
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        rope_theta, rope_scaling, partial = _rope(raw, FULL if family == "gemma3" else None, max_positions)
        sliding_theta = sliding_scaling = None
        if family == "gemma3":
            sliding_theta, sliding_scaling, _ = _rope(raw, SLIDING, max_positions)
        rotary_dim = int(head_dim * partial)
        for theta, scaling in ((rope_theta, rope_scaling), (sliding_theta, sliding_scaling)):
            if theta is not None:  # an unknown rope type or a factor list of the wrong length: refused here
                rope_inv_freq(rotary_dim, theta, scaling)
        activation = raw.get("hidden_activation") or raw.get("hidden_act") or "silu"
        if activation not in HIDDEN_ACTIVATIONS:
            raise ValueError(f"unsupported MLP activation {activation!r} (supported: {', '.join(HIDDEN_ACTIVATIONS)})")
        return cls(
            architecture=architecture,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden_size,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", is_gemma)),
            has_qkv_bias=bool(raw.get("attention_bias", family == "qwen2")),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            hidden_act=HIDDEN_ACTIVATIONS[activation],
            has_qk_norm=family in ("qwen3", "gemma3"),
            norm_adds_one=is_gemma,
            has_sandwich_norms=is_gemma,
            embedding_multiplier=math.sqrt(hidden_size) if is_gemma else 1.0,
            query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", head_dim)) if is_gemma else None,
            attn_logit_softcap=_optional_float(raw.get("attn_logit_softcapping")) if is_gemma else None,
            final_logit_softcap=_optional_float(raw.get("final_logit_softcapping")) if is_gemma else None,
            layer_windows=_layer_windows(raw, family, num_layers, max_positions),
            sliding_rope_theta=sliding_theta,
            sliding_rope_scaling=sliding_scaling,
            partial_rotary_factor=partial,
        )

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelFormatError(path, "missing (not a model directory)")
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ModelFormatError(path, f"unreadable: {error}") from None
        return cls.from_dict(raw, source=str(path))


def _optional_float(value) -> float | None:
    return None if value is None else float(value)


def _rope(raw: dict, layer_type: str | None, max_positions: int) -> tuple[float, dict | None, float]:
    """-> (theta, scaling or None for plain RoPE, partial rotary factor) of the global layers
    (layer_type None or FULL) or the sliding ones (SLIDING, Gemma 3's local RoPE).

    transformers 5 writes `rope_parameters` (theta included; per layer type for Gemma 3); 4.x
    writes `rope_theta` and `rope_scaling` (Gemma 3: `rope_local_base_freq` for its local layers,
    whose RoPE is never scaled)."""
    parameters = raw.get("rope_parameters")
    if layer_type is not None and isinstance(parameters, dict) and layer_type in parameters:
        rope = dict(parameters[layer_type] or {})
    elif layer_type == SLIDING:
        rope = {"rope_theta": raw.get("rope_local_base_freq", 10000.0)}
    else:
        rope = dict(parameters or raw.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    partial = float(rope.pop("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return theta, None, partial
    if rope_type in ("longrope", "su"):
        # the factor and original context HF derives when the config leaves them out
        original = int(rope.get("original_max_position_embeddings")
                       or raw.get("original_max_position_embeddings") or max_positions)
        rope["original_max_position_embeddings"] = original
        rope.setdefault("factor", max_positions / original)
    return theta, rope, partial


def _layer_windows(raw: dict, family: str, num_layers: int, max_positions: int) -> tuple[int | None, ...]:
    """Each layer's sliding window, as transformers applies it: `layer_types` when the config has
    them, else the family's rule (Gemma 2: even layers slide; Gemma 3: all but every
    `sliding_window_pattern`-th; Qwen2/3: layers from `max_window_layers` on, with
    `use_sliding_window`; Mistral and Phi-3: every layer, whenever `sliding_window` is set).
    A window of at least max_position_embeddings hides nothing (Phi-4-mini's 262144 of 131072):
    no window then, so those layers keep the plain causal paths."""
    window = raw.get("sliding_window")
    if family == "llama" or window is None or int(window) >= max_positions:
        return ()
    window = int(window)
    layer_types = raw.get("layer_types")
    if family in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        return ()
    if layer_types is None:
        if family == "gemma2":
            layer_types = [SLIDING if (i + 1) % 2 else FULL for i in range(num_layers)]
        elif family == "gemma3":
            pattern = int(raw.get("sliding_window_pattern", 6))
            layer_types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
        elif family in ("qwen2", "qwen3"):
            first = int(raw.get("max_window_layers", num_layers))
            layer_types = [SLIDING if i >= first else FULL for i in range(num_layers)]
        else:
            layer_types = [SLIDING] * num_layers
    if len(layer_types) != num_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
    windows = tuple(window if kind == SLIDING else None for kind in layer_types)
    return windows if any(w is not None for w in windows) else ()

"""How KV is stored: the formats of a page's values, their quantize / dequantize reference, and the
per-layer object the model hands its backend (`LayerKV`: K and V, each `KVPages`).

Formats (K and V each have their own, named by these strings everywhere: flags, the tier's
fingerprint, /metrics):
  - float32, bfloat16: values (num_pages, page_size, KVH, D) in that dtype, no scales;
  - int8: values (num_pages, page_size, KVH, D) int8 plus scales (num_pages, page_size, KVH) float32,
    symmetric per (token, head): x ~= q * scale, scale = absmax / 127, q = round(x / scale) (half to
    even) in [-127, 127]; an all-zero row has scale 0 and q 0.
  - float8: values float8_e4m3fn plus scales laid out as int8's: x ~= q * scale, scale = absmax / 448,
    q = x / scale cast to e4m3 (round to nearest even, |q| <= 448); an all-zero row has scale 0 and q 0.
    e4m3 (3 mantissa bits: a value rounds within 1/16 of itself), not e5m2 (2 bits, 1/8): with a scale
    per row, the values of a (token, head) row span a range e4m3's exponents cover, so precision is what
    counts, not e5m2's wider range (vLLM's default fp8 KV is e4m3 too, with per-tensor or calibrated
    per-head scales). The scale, computed at store time like int8's (no calibration), puts the row's
    absmax at e4m3's largest value: without it, rows of small values fall into e4m3's subnormals (below
    2^-6) and lose their bits, and values above 448 saturate. Read by the torch backend only (the C
    kernels do not: C_KV_DTYPES), on the CPU as the reference and on CUDA devices with fp8 (compute
    capability >= 8.9, model/backends/kv_formats.py).
The C kernels (kernels/csrc/row_ops.c, decode_attention.c) implement the same int8 quantization; this
file is the reference they are tested against. Attention reads a format directly: a reader dequantizes
only the slots it gathers (`KVPages.gather`), never a copy of the pool. float8 tensors are moved by
their bytes (uint8 views): torch's CPU index_copy_ has no float8 kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

KV_DTYPES = ("float32", "bfloat16", "int8")  # offered (flags); float16 stores a float16 model's KV as is
# Built and tested, not offered: under the bar of top-1 agreement >= 0.98 against float32 KV on the default
# model (docs/performance.md, Quantized KV pages). An EngineConfig takes it (bench/kv_dtype_quality.py), no flag.
UNOFFERED_KV_DTYPES = ("float8",)
C_KV_DTYPES = ("float32", "bfloat16", "int8")  # what the cpu backend's C kernels read (kv_formats.h)
_VALUE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int8": torch.int8,
                 "float8": torch.float8_e4m3fn}
_SCALED = {"int8": 127.0, "float8": 448.0}  # the largest stored value: scale = absmax / it
INT8_MAX = _SCALED["int8"]
FLOAT8_MAX = _SCALED["float8"]  # torch.finfo(torch.float8_e4m3fn).max


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The KV format that stores a model dtype as is ("float32", "bfloat16", "float16")."""
    for name, value_dtype in _VALUE_DTYPES.items():
        if value_dtype == dtype and name not in _SCALED:
            return name
    raise ValueError(f"no KV format stores {dtype} as is; choose one of {', '.join(KV_DTYPES)}")


def value_dtype(kv_dtype: str) -> torch.dtype:
    if kv_dtype not in _VALUE_DTYPES:
        raise ValueError(f"KV dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    return _VALUE_DTYPES[kv_dtype]


def as_pages(cache: Tensor | KVPages) -> KVPages:
    """A bare (num_pages, page_size, KVH, D) tensor is pages of its own dtype, without scales."""
    return cache if isinstance(cache, KVPages) else KVPages(kv_dtype_name(cache.dtype), cache)


def has_scales(kv_dtype: str) -> bool:
    return kv_dtype in _SCALED


def bytes_per_token_head(kv_dtype: str, head_dim: int) -> int:
    """Bytes one (token, KV head) row of K or V costs in this format, its scale included."""
    element_size = torch.empty((), dtype=value_dtype(kv_dtype)).element_size()
    return head_dim * element_size + (4 if has_scales(kv_dtype) else 0)


def quantize(kv_dtype: str, x: Tensor) -> tuple[Tensor, Tensor]:
    """x (..., D) float -> (q (..., D) in the scaled format kv_dtype ("int8" or "float8"), scale (...)
    float32), x ~= q * scale; scale = absmax / the format's largest value, an all-zero row scale 0, q 0."""
    if kv_dtype not in _SCALED:
        raise ValueError(f"{kv_dtype} KV has no scales to quantize with")
    largest = _SCALED[kv_dtype]
    x = x.float()
    absmax = x.abs().amax(dim=-1)
    inverse = torch.where(absmax > 0, largest / absmax, torch.zeros_like(absmax))
    scaled = x * inverse.unsqueeze(-1)
    if kv_dtype == "int8":
        q = torch.round(scaled).clamp_(-largest, largest).to(torch.int8)
    else:  # x * (448 / absmax) can round a hair past 448: clamp, so the cast never depends on saturation
        q = scaled.clamp_(-largest, largest).to(torch.float8_e4m3fn)
    return q, absmax / largest


def dequantize(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """q (..., D) int8 or float8_e4m3fn, scale (...) -> (..., D) in `dtype`: q * scale."""
    return (q.float() * scale.unsqueeze(-1)).to(dtype)


def _bytes(t: Tensor) -> Tensor:
    """float8 values as their bytes (uint8, same shape): what index ops run on (no float8 kernels on
    the CPU); other dtypes as they are."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _select(t: Tensor, index: Tensor) -> Tensor:
    """t.index_select(0, index) in t's dtype, float8 included."""
    return _bytes(t).index_select(0, index).view(t.dtype)


@dataclass(frozen=True, eq=False)
class KVPages:
    """K or V of one layer. `values` (num_pages, page_size, KVH, D) in the format's dtype; `scales`
    (num_pages, page_size, KVH) float32 for int8 and float8, else None. Slot s = page * page_size + offset."""

    kv_dtype: str
    values: Tensor
    scales: Tensor | None = None

    def __post_init__(self):
        if self.values.dtype != value_dtype(self.kv_dtype):
            raise ValueError(f"{self.kv_dtype} KV needs {value_dtype(self.kv_dtype)} values, got {self.values.dtype}")
        if has_scales(self.kv_dtype) != (self.scales is not None):
            raise ValueError(f"{self.kv_dtype} KV {'needs' if has_scales(self.kv_dtype) else 'has no'} scales")
        if self.scales is not None and self.scales.shape != self.values.shape[:3]:
            raise ValueError(f"scales {tuple(self.scales.shape)} do not fit values {tuple(self.values.shape)}")

    @classmethod
    def zeros(cls, kv_dtype: str, dims: tuple[int, int, int, int], device) -> KVPages:
        """Pages of `dims` (num_pages, page_size, KVH, D), all zero (touched now: RSS paid up front)."""
        values = torch.zeros(dims, dtype=value_dtype(kv_dtype), device=device)
        scales = torch.zeros(dims[:3], dtype=torch.float32, device=device) if has_scales(kv_dtype) else None
        return cls(kv_dtype, values, scales)

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def is_quantized(self) -> bool:
        return self.scales is not None

    @property
    def planes(self) -> tuple[Tensor, ...]:
        """The tensors that hold these pages, each indexed by page first: what a copy of pages
        (the disk tier) moves, byte for byte."""
        return (self.values,) if self.scales is None else (self.values, self.scales)

    def slot_values(self) -> Tensor:
        """(S, KVH, D) view of the values, row s = slot s."""
        _, _, num_kv_heads, head_dim = self.values.shape
        return self.values.view(-1, num_kv_heads, head_dim)

    def slot_scales(self) -> Tensor | None:
        """(S, KVH) view of the scales, or None."""
        return None if self.scales is None else self.scales.view(-1, self.scales.shape[2])

    def store(self, slot_ids: Tensor, x: Tensor) -> None:
        """Writes x (N, KVH, D) into slots slot_ids (N,), converted to the format.

        view (not reshape) on purpose: a non-contiguous cache must fail loudly rather than
        have the write land in a copy."""
        if self.scales is None:
            self.slot_values().index_copy_(0, slot_ids, x.to(self.values.dtype))
            return
        q, scale = quantize(self.kv_dtype, x)
        _bytes(self.slot_values()).index_copy_(0, slot_ids, _bytes(q))
        self.slot_scales().index_copy_(0, slot_ids, scale)

    def gather(self, slot_ids: Tensor, dtype: torch.dtype) -> Tensor:
        """Slots slot_ids (M,) -> (M, KVH, D) in `dtype`: only these rows are dequantized."""
        values = _select(self.slot_values(), slot_ids)
        if self.scales is None:
            return values if values.dtype == dtype else values.to(dtype)
        return dequantize(values, self.slot_scales().index_select(0, slot_ids), dtype)

    def take_rows(self, slot_ids: Tensor) -> StoredRows:
        """Slots slot_ids (M,) as stored (no conversion): a copy that store_rows puts back bit for bit."""
        scales = self.slot_scales()
        return StoredRows(self.kv_dtype, _select(self.slot_values(), slot_ids),
                          None if scales is None else scales.index_select(0, slot_ids))


@dataclass(frozen=True, eq=False)
class StoredRows:
    """Rows of K or V kept outside the pool in their stored format (the document store):
    values (..., M, KVH, D), scales (..., M, KVH) or None."""

    kv_dtype: str
    values: Tensor
    scales: Tensor | None

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def num_bytes(self) -> int:
        size = self.values.numel() * self.values.element_size()
        return size + (0 if self.scales is None else self.scales.numel() * 4)

    def dequantized(self, dtype: torch.dtype) -> Tensor:
        if self.scales is None:
            return self.values if self.values.dtype == dtype else self.values.to(dtype)
        return dequantize(self.values, self.scales, dtype)

    def __getitem__(self, index) -> StoredRows:
        """Indexes the leading dimensions of both (e.g. [layer, rows])."""
        return StoredRows(self.kv_dtype, self.values[index], None if self.scales is None else self.scales[index])


class LayerKV(NamedTuple):
    """One layer's KV cache: what the model passes to its backend's rope_store_kv and attention."""

    k: KVPages
    v: KVPages

    @property
    def is_plain(self) -> bool:
        """Both float32 without scales: the layout every kernel took before quantized KV."""
        return self.k.kv_dtype == "float32" and self.v.kv_dtype == "float32"

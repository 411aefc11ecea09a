"""The preallocated KV tensors: one (K, V) pair of pages per layer, in the pool's KV formats.

Sized once from a byte budget and never grown; which pages are free or shared
is the `PageAllocator`'s and `RadixTree`'s business, not this module's. A page's
bytes count its values and, for a quantized format, its scales (kernels/kv_format.py),
so a smaller format holds more tokens in the same budget.
"""

from dataclasses import dataclass

import torch

from kernels.kv_format import KVPages, LayerKV, bytes_per_token_head, kv_dtype_name, value_dtype


@dataclass(frozen=True)
class KVPoolShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype  # the model's activations (what attention computes in)
    kv_dtype_k: str | None = None  # K's stored format (kernels/kv_format.py); None: `dtype` as is
    kv_dtype_v: str | None = None  # V's

    def __post_init__(self):
        if self.page_size <= 0:
            raise ValueError(f"page_size must be positive, got {self.page_size}")
        for name in ("kv_dtype_k", "kv_dtype_v"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, kv_dtype_name(self.dtype))
            value_dtype(getattr(self, name))  # a ValueError for an unknown name

    @property
    def kv_dtype_label(self) -> str:
        """"int8", or "K int8, V bfloat16" when they differ."""
        if self.kv_dtype_k == self.kv_dtype_v:
            return self.kv_dtype_k
        return f"K {self.kv_dtype_k}, V {self.kv_dtype_v}"

    @property
    def tier_dtype_name(self) -> str:
        """What the tier's fingerprint calls these pages: the model dtype alone where K and V store it
        as is (the name tiers had before quantized KV, so their files stay hits), else with the formats."""
        plain = kv_dtype_name(self.dtype)
        if self.kv_dtype_k == plain and self.kv_dtype_v == plain:
            return plain
        return f"{plain}, KV K {self.kv_dtype_k} V {self.kv_dtype_v}"

    @property
    def bytes_per_page(self) -> int:
        """Bytes one page costs across all layers, K and V, scales included."""
        per_token_head = (bytes_per_token_head(self.kv_dtype_k, self.head_dim)
                          + bytes_per_token_head(self.kv_dtype_v, self.head_dim))
        return self.num_layers * self.page_size * self.num_kv_heads * per_token_head

    def num_pages_for(self, num_bytes: int) -> int:
        return num_bytes // self.bytes_per_page


class KVPool:
    """`layers[l]`: layer l's LayerKV, K and V pages (num_pages, page_size, num_kv_heads, head_dim)."""

    def __init__(self, shape: KVPoolShape, num_pages: int, device: torch.device):
        if num_pages <= 0:
            raise ValueError(f"a KV pool needs at least one page, got {num_pages}")
        self.shape = shape
        self.num_pages = num_pages
        self.page_size = shape.page_size
        dims = (num_pages, shape.page_size, shape.num_kv_heads, shape.head_dim)
        # zeros, not empty: touches every page now so RSS is paid up front
        # and never grows while serving.
        self.layers = [LayerKV(KVPages.zeros(shape.kv_dtype_k, dims, device),
                               KVPages.zeros(shape.kv_dtype_v, dims, device)) for _ in range(shape.num_layers)]
        self.device = torch.device(device)

    @property
    def tier_planes(self) -> list[torch.Tensor]:
        """Every tensor of the pool, each indexed by page first: K of each layer (its values, then its
        scales if any), then V of each layer. A page's bytes in a tier are its row of each, in this
        order (in float32: (2 * num_layers, page_size, KVH, D), the layout tiers always had)."""
        return [plane for half in (0, 1) for layer in self.layers for plane in layer[half].planes]

    @property
    def num_bytes(self) -> int:
        return self.num_pages * self.shape.bytes_per_page

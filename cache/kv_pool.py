"""The preallocated KV tensors: one (K, V) pair per layer, indexed by page.

Sized once from a byte budget and never grown; which pages are free or shared
is the `PageAllocator`'s and `RadixTree`'s business, not this module's.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVPoolShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype

    def __post_init__(self):
        if self.page_size <= 0:
            raise ValueError(f"page_size must be positive, got {self.page_size}")

    @property
    def bytes_per_page(self) -> int:
        """Bytes one page costs across all layers, K and V."""
        element_size = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.page_size * self.num_kv_heads * self.head_dim * element_size

    def num_pages_for(self, num_bytes: int) -> int:
        return num_bytes // self.bytes_per_page


class KVPool:
    """`k_caches[l]`, `v_caches[l]`: (num_pages, page_size, num_kv_heads, head_dim)."""

    def __init__(self, shape: KVPoolShape, num_pages: int, device: torch.device):
        if num_pages <= 0:
            raise ValueError(f"a KV pool needs at least one page, got {num_pages}")
        self.shape = shape
        self.num_pages = num_pages
        self.page_size = shape.page_size
        dims = (num_pages, shape.page_size, shape.num_kv_heads, shape.head_dim)
        # zeros, not empty: touches every page now so RSS is paid up front
        # and never grows while serving.
        self.k_caches = [torch.zeros(dims, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]
        self.v_caches = [torch.zeros(dims, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(zip(self.k_caches, self.v_caches))

    def slot_rows(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s (K, V) as views (num_pages * page_size, num_kv_heads, head_dim): row s is
        KV slot s (page s // page_size, offset s % page_size), for index_select / index_copy_."""
        dims = (-1, self.shape.num_kv_heads, self.shape.head_dim)
        return self.k_caches[layer].view(dims), self.v_caches[layer].view(dims)

    @property
    def num_bytes(self) -> int:
        return self.num_pages * self.shape.bytes_per_page

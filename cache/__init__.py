"""KV prefix cache bookkeeping: page allocator, radix tree of cached prefixes, eviction.

Plain Python, no torch. The KV tensors themselves are in cache.kv_pool, which is not
imported here, so the bookkeeping imports (and is tested) without torch.
"""

from cache.eviction import EvictionPolicy, LFUPolicy, LRUPolicy
from cache.page_allocator import OutOfPages, PageAllocator, PageRefError
from cache.page_hash import PAGE_HASH_NUM_BYTES, ROOT_PAGE_HASH, DerivedSalt, hash_page, hash_pages
from cache.radix_tree import MatchResult, RadixTree
from cache.tree_audit import cached_page_ids, cached_prefix_pages, check_tree_invariants
from cache.tree_node import TreeNode

__all__ = [
    "DerivedSalt",
    "EvictionPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "MatchResult",
    "OutOfPages",
    "PAGE_HASH_NUM_BYTES",
    "PageAllocator",
    "PageRefError",
    "RadixTree",
    "ROOT_PAGE_HASH",
    "TreeNode",
    "cached_page_ids",
    "cached_prefix_pages",
    "check_tree_invariants",
    "hash_page",
    "hash_pages",
]

"""One node of the radix tree: a run of full KV pages on one cached prefix path.

The RadixTree owns and mutates nodes; everyone else treats them as opaque handles (pass
``MatchResult.last_node`` back to ``lock``/``unlock``/``page_hashes``) or reads them.
"""

from __future__ import annotations


class TreeNode:
    __slots__ = (
        "parent",
        "children",
        "token_ids",
        "page_ids",
        "page_hashes",
        "cache_salt",
        "lock_ref",
        "last_access_time",
        "hit_count",
    )

    def __init__(
        self,
        parent: TreeNode | None,
        token_ids: tuple[int, ...],
        page_ids: list[int],
        page_hashes: list[bytes],
        cache_salt: str | None,
        lock_ref: int = 0,
        last_access_time: int = 0,
        hit_count: int = 0,
    ):
        # None for the root, and for a node taken out of its tree (evicted, or the tree reset).
        self.parent = parent
        # (cache_salt, tokens of the child's first page) -> child
        self.children: dict[tuple[str | None, tuple[int, ...]], TreeNode] = {}
        self.token_ids = token_ids  # (num_pages * page_size,)
        self.page_ids = page_ids  # (num_pages,) page i holds token_ids[i*page_size:(i+1)*page_size]
        self.page_hashes = page_hashes  # (num_pages,) chained hash of the prefix ending at page i
        self.cache_salt = cache_salt
        self.lock_ref = lock_ref  # running requests whose locked path passes through this node
        self.last_access_time = last_access_time  # tree clock tick of the last match/insert here
        self.hit_count = hit_count  # matches that reached this node

    @property
    def num_pages(self) -> int:
        return len(self.page_ids)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def __repr__(self) -> str:
        return (
            f"TreeNode(pages={self.page_ids}, lock_ref={self.lock_ref}, "
            f"t={self.last_access_time}, children={len(self.children)})"
        )

"""Radix tree of cached KV prefixes at page granularity (SGLang's RadixAttention, paged).

Invariants:
  - The root holds no pages. Every other node holds a run of >= 1 full pages:
    len(token_ids) == num_pages * page_size, one page id and one page hash per page.
  - Children are keyed by (cache_salt, tokens of their first page), so siblings never share a
    first page and a prefix has at most one path. Folding cache_salt into every key keeps
    tenants apart: sequences with different keys never share a node (None is a key too).
  - Only full pages are cached. Sequences that diverge inside a page get different pages.
  - lock_ref(node) >= lock_ref(child): lock/unlock walk the whole path to the root.
  - last_access_time(node) >= last_access_time(child), and likewise hit_count: every
    match/insert stamps its whole path. So a parent never outranks its children for eviction.
  - The tree holds exactly one allocator reference on each page it caches: taken in insert,
    given back in evict and reset.

Derived KV (document KV placed at a new position, and everything computed after it) is cached
under a DerivedSalt (cache/page_hash.py) in the keys of its nodes, hanging below the exact node
where the request's exact KV ended: a walk with a plain salt never enters it, a walk given the
derived salt continues into it once the exact path ends (match_prefix/insert `derived_salt`).
Below a derived node there are only derived nodes.

Splits: match_prefix and insert split a node at a page boundary when the path they follow
ends inside the node's run, so the node they stop at ends exactly where the match ends (the
``last_node`` to lock). A split changes no cached content and no page count. The lower part
stays the same TreeNode object, so handles given out earlier stay valid; the new upper node
copies its lock_ref, last_access_time and hit_count, so locks taken before the split stay
balanced and the ordering invariants above still hold.

Not thread-safe: the engine loop is its only user.
"""

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from cache.eviction import EvictionPolicy, LRUPolicy
from cache.page_events import PageEvent, PageEventKind, PageListener
from cache.page_allocator import PageAllocator
from cache.page_hash import ROOT_PAGE_HASH, DerivedSalt, hash_pages
from cache.tree_node import TreeNode


class MatchResult(NamedTuple):
    page_ids: list[int]  # (num_tokens // page_size,) pages holding the matched prefix, in order
    num_tokens: int  # len(page_ids) * page_size
    last_node: TreeNode  # deepest node of the match (the root when nothing matched); lock it


class RadixTree:
    def __init__(
        self,
        page_size: int,
        allocator: PageAllocator,
        eviction_policy: EvictionPolicy | None = None,
    ):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.eviction_policy = eviction_policy if eviction_policy is not None else LRUPolicy()
        self._allocator = allocator
        self._root = _new_root()
        self._clock = 0  # counts match/insert calls; the "time" of last_access_time
        self.num_evicted_pages = 0  # pages allocate_pages evicted so far (metrics)
        self._num_locked_pages = 0  # pages in nodes with lock_ref > 0
        self._num_evictable_pages = 0  # pages in nodes with lock_ref == 0
        # Told of every page stored, removed or cleared (cache/page_events.py); the engine's
        # owner appends to it (e.g. a replica reporting what it holds to a router).
        self.page_listeners: list[PageListener] = []

    @property
    def root(self) -> TreeNode:
        """The root node, for inspection (tests, debugging). Do not mutate."""
        return self._root

    @property
    def clock(self) -> int:
        """Match/insert calls so far: `clock - node.last_access_time` is how long ago a node was used."""
        return self._clock

    @property
    def num_cached_pages(self) -> int:
        return self._num_locked_pages + self._num_evictable_pages

    @property
    def num_evictable_pages(self) -> int:
        """Pages in unlocked nodes; evict() can free all of them (leaves first)."""
        return self._num_evictable_pages

    @property
    def num_locked_pages(self) -> int:
        return self._num_locked_pages

    def match_prefix(self, token_ids: Sequence[int], cache_salt: str | None = None,
                     derived_salt: DerivedSalt | None = None, max_exact_pages: int | None = None) -> MatchResult:
        """Longest cached prefix of ``token_ids`` made of full pages.

        With ``derived_salt``: exact pages (``cache_salt``) as far as they go, at most
        ``max_exact_pages`` of them, then derived ones (``derived_salt``) from there on.
        Changes no cached content, but stamps the matched path's access time and hit count,
        and may split the last node (see the module docstring). Takes no lock and no page
        reference: lock(result.last_node) before anything may evict.
        """
        num_pages = len(token_ids) // self.page_size
        num_exact_pages = num_pages if derived_salt is None or max_exact_pages is None else min(num_pages,
                                                                                              max_exact_pages)
        last_node, page_ids = self._descend(token_ids, num_exact_pages, cache_salt)
        if derived_salt is not None and len(page_ids) < num_pages:
            last_node, page_ids = self._descend(token_ids, num_pages, derived_salt, last_node, page_ids)
        self._touch(last_node, is_hit=True)
        return MatchResult(page_ids, len(page_ids) * self.page_size, last_node)

    def peek_prefix(self, token_ids: Sequence[int], cache_salt: str | None = None) -> int:
        """Tokens of the longest cached exact prefix of ``token_ids`` (full pages), as match_prefix
        finds it; changes nothing (no access stamp, no split): for ordering and estimates."""
        _, page_ids = self._descend(token_ids, len(token_ids) // self.page_size, cache_salt, split=False)
        return len(page_ids) * self.page_size

    def allocate_pages(self, num_pages: int) -> list[int] | None:
        """``num_pages`` fresh pages (the caller holds one reference on each), evicting unlocked cache
        for them if the pool's free pages fall short; None when even that leaves too few (whatever
        was evicted stays evicted)."""
        if num_pages == 0:
            return []
        shortfall = num_pages - self._allocator.num_free_pages
        if shortfall > 0:
            self.num_evicted_pages += self.evict(shortfall)
        if self._allocator.num_free_pages < num_pages:
            return None
        return self._allocator.allocate(num_pages)

    @property
    def num_allocatable_pages(self) -> int:
        """Pages allocate_pages can hand out now: the pool's free pages and the evictable cache."""
        return self._allocator.num_free_pages + self._num_evictable_pages

    def release_pages(self, page_ids: Sequence[int]) -> None:
        """Give back one reference on each of these pages (from allocate_pages)."""
        self._allocator.release(page_ids)

    def insert(
        self, token_ids: Sequence[int], page_ids: Sequence[int], cache_salt: str | None = None,
        derived_salt: DerivedSalt | None = None, num_exact_pages: int | None = None,
    ) -> int:
        """Cache the full pages of ``token_ids``, held in ``page_ids`` (extra ids ignored).

        With ``derived_salt``: the first ``num_exact_pages`` pages are exact (``cache_salt``),
        the rest derived and cached under ``derived_salt`` below them.
        Returns the number of tokens that were already cached (a multiple of page_size). The
        tree retains each page it adds. It does not retain the caller's ids for pages it
        already had: the caller still releases those, which frees the duplicates.
        """
        num_pages = len(token_ids) // self.page_size
        if len(page_ids) < num_pages:
            raise ValueError(f"{num_pages} full pages of tokens but only {len(page_ids)} page ids")
        if derived_salt is None or num_exact_pages is None or num_exact_pages >= num_pages:
            node, num_cached_pages = self._insert_run(self._root, [], token_ids, page_ids, num_pages, cache_salt)
        else:
            node, num_cached_pages = self._insert_run(self._root, [], token_ids, page_ids, num_exact_pages,
                                                      cache_salt)
            node, num_cached_derived = self._insert_run(node, list(page_ids[:num_exact_pages]), token_ids, page_ids,
                                                        num_pages, derived_salt)
            num_cached_pages += num_cached_derived
        self._touch(node, is_hit=False)
        return num_cached_pages * self.page_size

    def _insert_run(self, node: TreeNode, matched_page_ids: list[int], token_ids: Sequence[int],
                    page_ids: Sequence[int], num_pages: int, cache_salt) -> tuple[TreeNode, int]:
        """Pages len(matched_page_ids)..num_pages of token_ids below `node` (which ends where
        matched_page_ids do) under `cache_salt` -> (their last node, how many were cached already)."""
        page_size = self.page_size
        num_before = len(matched_page_ids)
        node, cached_page_ids = self._descend(token_ids, num_pages, cache_salt, node, matched_page_ids)
        num_cached_pages = len(cached_page_ids)
        if num_cached_pages < num_pages:
            new_page_ids = list(page_ids[num_cached_pages:num_pages])
            self._allocator.retain(new_page_ids)  # first, so a bad id leaves the tree as it was
            new_token_ids = tuple(token_ids[num_cached_pages * page_size : num_pages * page_size])
            node = self._add_child(node, new_token_ids, new_page_ids, cache_salt)
        return node, num_cached_pages - num_before

    def lock(self, node: TreeNode) -> None:
        """Pin ``node`` and its ancestors: lock_ref += 1 on each. Locked nodes are never evicted."""
        self._check_in_tree(node)
        while node is not self._root:
            if node.lock_ref == 0:
                self._num_evictable_pages -= node.num_pages
                self._num_locked_pages += node.num_pages
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        """Undo one lock(node). Raises, changing nothing, if ``node`` is not locked."""
        self._check_in_tree(node)
        if node is not self._root and node.lock_ref == 0:
            raise ValueError(f"unlock of {node}, which is not locked")
        while node is not self._root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._num_locked_pages -= node.num_pages
                self._num_evictable_pages += node.num_pages
            node = node.parent

    def evict(self, num_pages: int) -> int:
        """Remove unlocked leaves, lowest eviction priority first, releasing their pages,
        until at least ``num_pages`` pages were released or nothing is evictable. A parent
        left childless and unlocked joins the candidates. Returns the pages released."""
        tie_breaker = itertools.count()  # heap entries never compare nodes
        heap = [
            (self.eviction_policy.priority(leaf), next(tie_breaker), leaf)
            for leaf in self._iter_nodes()
            if leaf.is_leaf and leaf.lock_ref == 0 and leaf is not self._root
        ]
        heapq.heapify(heap)
        num_released_pages = 0
        while num_released_pages < num_pages and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            num_released_pages += leaf.num_pages
            self._remove_leaf(leaf)
            if parent is not self._root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(
                    heap, (self.eviction_policy.priority(parent), next(tie_breaker), parent)
                )
        return num_released_pages

    def page_hashes(self, node: TreeNode) -> list[bytes]:
        """Chained hash of every page on the root -> node path, root side first."""
        self._check_in_tree(node)
        runs = []
        while node is not self._root:
            runs.append(node.page_hashes)
            node = node.parent
        return [page_hash for run in reversed(runs) for page_hash in run]

    def _descend(
        self, token_ids: Sequence[int], num_pages: int, cache_salt, node: TreeNode | None = None,
        matched_page_ids: list[int] | None = None, split: bool = True,
    ) -> tuple[TreeNode, list[int]]:
        """Follow the longest cached run of the first ``num_pages`` pages of ``token_ids``, from
        the root, or from ``node`` where the pages ``matched_page_ids`` already led.

        Returns the node where the run ends and its page ids; splits a node the run ends inside
        (without ``split``: returns the node above it, and the page ids of the whole run).
        """
        page_size = self.page_size
        tokens = tuple(token_ids[: num_pages * page_size])
        node = self._root if node is None else node
        matched_page_ids = [] if matched_page_ids is None else list(matched_page_ids)
        while len(matched_page_ids) < num_pages:
            start = len(matched_page_ids) * page_size
            child = node.children.get((cache_salt, tokens[start : start + page_size]))
            if child is None:
                break
            # The key matched the first page; count how many more of the child's pages match.
            num_comparable_pages = min(child.num_pages, num_pages - len(matched_page_ids))
            num_shared_pages = 1
            while num_shared_pages < num_comparable_pages:
                offset = num_shared_pages * page_size
                child_page = child.token_ids[offset : offset + page_size]
                if tokens[start + offset : start + offset + page_size] != child_page:
                    break
                num_shared_pages += 1
            is_split = num_shared_pages < child.num_pages
            if is_split and not split:
                matched_page_ids.extend(child.page_ids[:num_shared_pages])
                break
            if is_split:
                child = self._split(child, num_shared_pages)
            matched_page_ids.extend(child.page_ids)
            node = child
            if is_split:
                break
        return node, matched_page_ids

    def _split(self, node: TreeNode, num_upper_pages: int) -> TreeNode:
        """Cut ``node`` after its first ``num_upper_pages`` pages; returns the new upper node."""
        num_upper_tokens = num_upper_pages * self.page_size
        upper = TreeNode(
            parent=node.parent,
            token_ids=node.token_ids[:num_upper_tokens],
            page_ids=node.page_ids[:num_upper_pages],
            page_hashes=node.page_hashes[:num_upper_pages],
            cache_salt=node.cache_salt,
            lock_ref=node.lock_ref,
            last_access_time=node.last_access_time,
            hit_count=node.hit_count,
        )
        node.parent.children[self._key_of(node)] = upper
        node.token_ids = node.token_ids[num_upper_tokens:]
        node.page_ids = node.page_ids[num_upper_pages:]
        node.page_hashes = node.page_hashes[num_upper_pages:]
        node.parent = upper
        upper.children[self._key_of(node)] = node
        return upper

    def _add_child(
        self,
        parent: TreeNode,
        token_ids: tuple[int, ...],
        page_ids: list[int],
        cache_salt: str | None,
    ) -> TreeNode:
        parent_hash = parent.page_hashes[-1] if parent.page_hashes else ROOT_PAGE_HASH
        page_hashes = hash_pages(parent_hash, token_ids, self.page_size, cache_salt)
        child = TreeNode(parent, token_ids, page_ids, page_hashes, cache_salt)
        parent.children[self._key_of(child)] = child
        self._num_evictable_pages += child.num_pages
        self._emit(PageEventKind.STORED, page_hashes, page_ids, isinstance(cache_salt, DerivedSalt))
        return child

    def _remove_leaf(self, leaf: TreeNode) -> None:
        # Told before the pages are released: a listener may still read them (a tier's copy).
        self._emit(PageEventKind.REMOVED, leaf.page_hashes, leaf.page_ids, isinstance(leaf.cache_salt, DerivedSalt))
        self._allocator.release(leaf.page_ids)
        del leaf.parent.children[self._key_of(leaf)]
        leaf.parent = None
        self._num_evictable_pages -= leaf.num_pages

    def _emit(self, kind: PageEventKind, page_hashes: Sequence[bytes], page_ids: Sequence[int],
              is_derived: bool = False) -> None:
        if self.page_listeners:
            event = PageEvent(kind, tuple(page_hashes), tuple(page_ids), is_derived)
            for listener in self.page_listeners:
                listener(event)

    def _touch(self, node: TreeNode, is_hit: bool) -> None:
        """Stamp the path root -> node with a new clock tick (and a hit, for matches)."""
        self._clock += 1
        while node is not self._root:
            node.last_access_time = self._clock
            if is_hit:
                node.hit_count += 1
            node = node.parent

    def _key_of(self, node: TreeNode) -> tuple[str | None, tuple[int, ...]]:
        return (node.cache_salt, node.token_ids[: self.page_size])

    def _check_in_tree(self, node: TreeNode) -> None:
        if node is not self._root and node.parent is None:
            raise ValueError(f"{node} is no longer in the tree (evicted or reset)")

    def _iter_nodes(self) -> Iterator[TreeNode]:
        """Every node, the root included, parents before children."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def _new_root() -> TreeNode:
    return TreeNode(parent=None, token_ids=(), page_ids=[], page_hashes=[], cache_salt=None)

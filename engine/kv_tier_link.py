"""Moves KV pages between the pool and a tier below it: the tier as a KV source (engine/kv_source.py).

Payload layout of one page (KV_PAYLOAD_LAYOUT_VERSION 1), contiguous bytes: the page's row of each
of the pool's planes (KVPool.tier_planes), K of every layer first, then V; a layer's K is its values
(page_size, num_kv_heads, head_dim) in K's format, then, for int8, its scales (page_size,
num_kv_heads) float32. In float32 that is (2 * num_layers, page_size, num_kv_heads, head_dim) floats,
rows 0..L-1: K of layer l, L..2L-1: V. The formats are part of the tier's fingerprint.

Writes (engine thread): the pages are copied out of the pool into a host tensor, and the tier
gets a view of each page of it; the file I/O happens on the tier's writer thread. The copy is
taken when the pages enter the tree (write-through) or when they leave it (write-back, and in
both policies a page whose write-through copy was dropped), so a pool slot is free to be reused
the moment the tree lets go of it.

Reads (engine thread, at admission): after the tree's match, the match continues in the tier by
chained page hash; the hits are loaded into freshly allocated pages and inserted into the tree,
so the request locks them like any cached prefix and counts them as cached tokens.
"""

import logging
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch

from cache import MatchResult, RadixTree
from cache.disk_tier import DiskTier
from cache.disk_tier_lock import TierDirectoryBusy
from cache.kv_pool import KVPool
from cache.kv_tier import KVTier
from cache.page_events import PageEvent, PageEventKind
from cache.page_hash import ROOT_PAGE_HASH, hash_pages
from engine.kv_disk_config import KV_DISK_POLICIES
from engine.kv_source import KVSource, max_source_pages
from engine.kv_tier_fingerprint import kv_tier_fingerprint
from engine.metrics import EngineMetrics
from engine.request import Request

logger = logging.getLogger("radixserve.kv_tier")


class KVTierLink(KVSource):
    """The disk tier as a KV source (engine/kv_source.py): it loads at admission (`admit`) and saves
    on the tree's page events (`on_page_event`), so its runner side does nothing."""

    def __init__(self, tier: KVTier, kv_pool: KVPool, policy: str, metrics: EngineMetrics | None = None):
        if policy not in KV_DISK_POLICIES:
            raise ValueError(f"KV tier policy must be one of {', '.join(KV_DISK_POLICIES)}, got {policy!r}")
        self.tier = tier
        self.policy = policy
        self._pool = kv_pool
        self._metrics = metrics
        shape = kv_pool.shape
        self._planes = kv_pool.tier_planes
        self._plane_bytes = [plane[0].numel() * plane.element_size() for plane in self._planes]  # per page
        if tier.page_num_bytes != shape.bytes_per_page:
            raise ValueError(f"the tier keeps pages of {tier.page_num_bytes} bytes, "
                             f"the pool's are {shape.bytes_per_page}")
        self.page_size = shape.page_size
        # Counters for metrics: full-page tokens past the tree's match looked up in / loaded from the tier.
        self.num_query_tokens = 0
        self.num_hit_tokens = 0
        # A waiting request's chained page hashes, computed once: longest-prefix-first admission asks every
        # waiting request each step, and a request's tokens are only ever appended to (while it waits, never).
        self._page_hashes: weakref.WeakKeyDictionary[Request, list[bytes]] = weakref.WeakKeyDictionary()

    # ---- writes ---------------------------------------------------------

    def on_page_event(self, event: PageEvent) -> None:
        """The tree's page listener: pages that just entered it (write-through), and pages it is
        about to release, told before their slots can be reused (write-back, and in both policies
        a page whose write-through copy was dropped). Derived pages are never written: no lookup
        reads them from a tier (exact lookups must not, and a derived continuation is looked for in
        the tree only), so they would only push exact pages out of its byte bound."""
        if event.is_derived:
            return
        if event.kind is PageEventKind.REMOVED or (event.kind is PageEventKind.STORED
                                                   and self.policy == "write-through"):
            self._store(event.page_ids, event.page_hashes)

    def _store(self, page_ids: Sequence[int], page_hashes: Sequence[bytes]) -> None:
        todo = [(page_id, page_hash) for page_id, page_hash in zip(page_ids, page_hashes)
                if not self.tier.contains(page_hash)]
        if not todo:
            return
        pages = self._copy_out([page_id for page_id, _ in todo])  # (N, 2L, page_size, H, D) on the host
        for row, (_, page_hash) in enumerate(todo):
            self.tier.store(page_hash, _byte_view(pages[row]))

    def _copy_out(self, page_ids: list[int]) -> torch.Tensor:
        """(N, bytes_per_page) uint8 on the host: the pages' payloads."""
        index = torch.tensor(page_ids, device=self._pool.device)
        pages = torch.empty((len(page_ids), sum(self._plane_bytes)), dtype=torch.uint8, device="cpu")
        offset = 0
        for plane, num_bytes in zip(self._planes, self._plane_bytes):
            rows = plane.view(torch.uint8).index_select(0, index).view(len(page_ids), -1)  # bytes: float8 too
            pages[:, offset:offset + num_bytes].copy_(rows)
            offset += num_bytes
        return pages

    # ---- reads ----------------------------------------------------------

    def num_suppliable_tokens(self, request: Request, num_matched_tokens: int) -> int:
        """Full-page tokens past the first `num_matched_tokens` of the prompt the tier holds, up to the
        prompt's last page before its computed tail. Changes nothing (KVSource)."""
        max_num_pages = max_source_pages(request, self.page_size)
        num_matched_pages = num_matched_tokens // self.page_size
        if num_matched_pages >= max_num_pages:
            return 0
        hashes = self._request_page_hashes(request, max_num_pages)
        return self.tier.num_leading_hits(hashes[num_matched_pages:]) * self.page_size

    def _request_page_hashes(self, request: Request, num_pages: int) -> list[bytes]:
        """The chained hashes of the request's first `num_pages` pages, each page hashed once."""
        hashes = self._page_hashes.setdefault(request, [])
        if len(hashes) < num_pages:
            page_size = self.page_size
            tokens = request.all_token_ids[len(hashes) * page_size : num_pages * page_size]
            hashes += hash_pages(hashes[-1] if hashes else ROOT_PAGE_HASH, tokens, page_size, request.cache_salt)
        return hashes[:num_pages]

    def admit(self, request: Request, tree: RadixTree, max_num_pages: int) -> None:
        """Continue the request's tree match in the tier (KVSource): the hits are loaded into pages,
        inserted into the tree, and the request's lock moves to the longer match."""
        if request.num_tree_pages >= max_num_pages:
            return
        match = MatchResult(request.page_ids[: request.num_tree_pages], request.num_tree_pages * self.page_size,
                            request.tree_node)  # what the scheduler's match locked into the request
        num_loaded_before = self.num_hit_tokens
        extended = self.extend_match(tree, request.all_token_ids, request.cache_salt, match,
                                     self._request_page_hashes(request, max_num_pages))
        if request.timings.first_scheduled is None:  # counted at the first admission, as cached tokens are
            request.num_disk_tier_tokens = self.num_hit_tokens - num_loaded_before
        if extended.num_tokens <= request.num_tree_pages * self.page_size:
            return
        tree.lock(extended.last_node)
        tree.unlock(request.tree_node)
        request.tree_node = extended.last_node
        request.page_ids = list(extended.page_ids)
        request.num_tree_pages = len(extended.page_ids)
        request.num_computed_tokens = extended.num_tokens

    def extend_match(self, tree: RadixTree, token_ids: Sequence[int], cache_salt: str | None, match: MatchResult,
                     page_hashes: Sequence[bytes]) -> MatchResult:
        """Continue ``match`` (the tree's, of ``token_ids``) in the tier, up to ``len(page_hashes)`` pages
        in all (the request's chained page hashes, computed once per request): load the hits into pages from ``tree.allocate_pages`` (which may evict unlocked
        cache), insert them into the tree, and return the tree's new match. Takes no lock for the caller."""
        num_tree_pages, max_num_pages = len(match.page_ids), len(page_hashes)
        if num_tree_pages >= max_num_pages:
            return match
        page_size = self.page_size
        rest_hashes = page_hashes[num_tree_pages:]  # the request's own chain: the tree's pages hash alike
        self.num_query_tokens += len(rest_hashes) * page_size
        num_hits = self.tier.num_leading_hits(rest_hashes)
        if num_hits == 0:
            return match
        tree.lock(match.last_node)  # eviction to make room must not take the prefix the loads extend
        try:
            page_ids = tree.allocate_pages(min(num_hits, tree.num_allocatable_pages))
            if not page_ids:
                return match
            num_loaded = self._load(rest_hashes[: len(page_ids)], page_ids)
            if num_loaded:
                num_pages = num_tree_pages + num_loaded
                tree.insert(token_ids[: num_pages * page_size], list(match.page_ids) + page_ids[:num_loaded],
                            cache_salt)
            tree.release_pages(page_ids)  # the tree holds the loaded pages now; the others are free again
        finally:
            tree.unlock(match.last_node)
        self.num_hit_tokens += num_loaded * page_size
        return tree.match_prefix(token_ids[: max_num_pages * page_size], cache_salt)

    def _load(self, page_hashes: Sequence[bytes], page_ids: list[int]) -> int:
        """Load pages from the tier into ``page_ids``, in order, up to the first miss; returns
        how many were loaded."""
        pages = torch.empty((len(page_ids), sum(self._plane_bytes)), dtype=torch.uint8, device="cpu")
        num_loaded = 0
        for row, page_hash in enumerate(page_hashes):
            started = time.perf_counter()
            if not self.tier.load_into(page_hash, memoryview(_byte_view(pages[row]))):
                break
            num_loaded += 1
            if self._metrics is not None:
                self._metrics.observe("kv_disk_load", time.perf_counter() - started)
        if num_loaded:
            index = torch.tensor(page_ids[:num_loaded], device=self._pool.device)
            loaded = pages[:num_loaded].to(self._pool.device)
            offset = 0
            for plane, num_bytes in zip(self._planes, self._plane_bytes):
                target = plane.view(torch.uint8)  # byte for byte: index_copy_ has no float8 kernel on the CPU
                target.index_copy_(0, index, loaded[:, offset:offset + num_bytes].reshape(num_loaded, *target.shape[1:]))
                offset += num_bytes
        return num_loaded

    def close(self) -> None:
        self.tier.close()


def open_disk_tier_link(
    root: Path,
    max_bytes: int,
    policy: str,
    model_dir: Path,
    kv_pool: KVPool,
    device_type: str,
    metrics: EngineMetrics | None = None,
) -> KVTierLink | None:
    """The disk tier of this model and KV layout under ``root``, linked to ``kv_pool``; None (and a
    warning saying why) when the directory cannot be used: the engine then serves without a tier."""
    shape = kv_pool.shape
    fingerprint = kv_tier_fingerprint(model_dir, shape.tier_dtype_name, device_type,
                                      shape.page_size, shape.num_layers, shape.num_kv_heads, shape.head_dim)
    on_store = (lambda seconds: metrics.observe("kv_disk_store", seconds)) if metrics is not None else None
    try:
        tier = DiskTier(Path(root), fingerprint, shape.bytes_per_page, max_bytes, on_store=on_store)
    except (OSError, TierDirectoryBusy) as error:
        logger.warning("radixserve: KV disk tier off: %s", error)
        return None
    stats = tier.stats()
    logger.info("radixserve: KV disk tier at %s holds %d pages (%.1f of %.1f MiB, %s)", tier.directory,
                stats.num_pages, stats.num_bytes / 2**20, stats.max_bytes / 2**20, policy)
    return KVTierLink(tier, kv_pool, policy, metrics)


def _byte_view(page: torch.Tensor):
    """A writable uint8 numpy view of a contiguous host tensor (shares its memory, keeps it alive)."""
    if not page.is_contiguous():
        raise ValueError("a page buffer must be contiguous")
    return page.view(torch.uint8).view(-1).numpy()


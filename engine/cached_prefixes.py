"""The radix tree's largest cached prefixes of one tenant: what the console's cache view lists.

A cached prefix here is a root-to-leaf path of the tree: every leaf ends the longest prefix cached
along its path. Only paths of the tenant's salt are read (its exact nodes, and the derived nodes
below them where document KV was stitched in: cache/radix_tree.py), so a caller never sees another
tenant's tokens. Runs on the engine thread (the tree is not thread-safe); O(cached pages).
"""

import heapq
import itertools
import time
from dataclasses import dataclass

from cache import DerivedSalt, RadixTree
from cache.tree_node import TreeNode
from engine.prefix_pins import PrefixPins

PREVIEW_HEAD_TOKENS = 48  # token ids handed back from the start of each prefix (the server decodes them)
PREVIEW_TAIL_TOKENS = 16  # and from its end


@dataclass(frozen=True)
class CachedPrefix:
    num_tokens: int  # full pages only: num_pages * page_size
    num_pages: int
    num_derived_tokens: int  # of num_tokens, derived KV (document spans placed at a new position, and after)
    hit_count: int  # matches that reached the leaf
    num_ops_since_use: int  # tree operations (matches, inserts) since the leaf was last used: its age
    num_locking_requests: int  # running requests and pins holding the leaf
    num_pinned_tokens: int  # the longest pinned prefix along the path (0: none)
    pin_seconds_left: float  # of that pin
    head_token_ids: tuple[int, ...]
    tail_token_ids: tuple[int, ...]  # the last tokens, when the prefix is longer than head + tail


def largest_cached_prefixes(tree: RadixTree, pins: PrefixPins, cache_salt: str | None,
                            limit: int) -> list[CachedPrefix]:
    """The tenant's `limit` longest cached prefixes, longest first."""
    derived_salt = DerivedSalt(cache_salt)
    pinned = pins.pinned_nodes()
    now_tick = tree.clock
    leaves: list[tuple[int, int, list[TreeNode]]] = []  # (num_tokens, tie-break, path)
    tie_breaks = itertools.count()  # unique, so equal lengths never compare paths (TreeNodes have no order)
    salts = (cache_salt, derived_salt)
    stack = [[child] for child in tree.root.children.values() if child.cache_salt in salts]
    while stack:
        path = stack.pop()
        children = [child for child in path[-1].children.values() if child.cache_salt in salts]
        if not children:
            num_tokens = sum(len(node.token_ids) for node in path)
            entry = (num_tokens, next(tie_breaks), path)
            if len(leaves) < limit:
                heapq.heappush(leaves, entry)
            else:
                heapq.heappushpop(leaves, entry)
        stack.extend(path + [child] for child in children)
    return [_describe(path, pinned, now_tick) for _, _, path in sorted(leaves, reverse=True)]


def _describe(path: list[TreeNode], pinned: dict[int, float], now_tick: int) -> CachedPrefix:
    leaf = path[-1]
    num_tokens = num_derived = num_pinned = 0
    seconds_left = 0.0
    for node in path:
        num_tokens += len(node.token_ids)
        if isinstance(node.cache_salt, DerivedSalt):
            num_derived += len(node.token_ids)
        if id(node) in pinned:
            num_pinned, seconds_left = num_tokens, pinned[id(node)]
    token_ids = [t for node in path for t in node.token_ids]
    is_long = len(token_ids) > PREVIEW_HEAD_TOKENS + PREVIEW_TAIL_TOKENS
    head = tuple(token_ids[:PREVIEW_HEAD_TOKENS] if is_long else token_ids)
    tail = tuple(token_ids[-PREVIEW_TAIL_TOKENS:]) if is_long else ()
    return CachedPrefix(num_tokens=num_tokens, num_pages=sum(node.num_pages for node in path),
                        num_derived_tokens=num_derived, hit_count=leaf.hit_count,
                        num_ops_since_use=now_tick - leaf.last_access_time, num_locking_requests=leaf.lock_ref,
                        num_pinned_tokens=num_pinned, pin_seconds_left=round(seconds_left, 1),
                        head_token_ids=head, tail_token_ids=tail)


def cached_prefixes_now(engine, cache_salt: str | None, limit: int) -> tuple[float, list[CachedPrefix]]:
    """(unix time of the reading, the prefixes) of an LLMEngine; call on its thread."""
    return time.time(), largest_cached_prefixes(engine.scheduler.tree, engine.pins, cache_salt, limit)

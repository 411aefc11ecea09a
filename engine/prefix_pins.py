"""Cached prefixes held back from eviction for a while (session pinning).

An agent turn that ends in a tool call will be continued once the tool has
run, seconds later; its prompt + generated pages are in the radix tree but
unlocked, so under memory pressure LRU eviction could take them just before
the continuation arrives. A pin is one more lock on the prefix's last node,
released when its deadline passes.
"""

import heapq
import itertools
import time
from collections.abc import Sequence

from cache import RadixTree


class PrefixPins:
    def __init__(self, tree: RadixTree):
        self.tree = tree
        self._deadlines: list[tuple[float, int, object]] = []  # heap of (deadline, tie-break, locked node)
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._deadlines)

    def pin(self, token_ids: Sequence[int], cache_salt: str | None, seconds: float,
            now: float | None = None) -> int:
        """Lock the longest cached prefix of `token_ids` until now + seconds; returns its token count."""
        match = self.tree.match_prefix(token_ids, cache_salt)
        if match.num_tokens == 0 or seconds <= 0:
            return 0
        self.tree.lock(match.last_node)
        deadline = (time.monotonic() if now is None else now) + seconds
        heapq.heappush(self._deadlines, (deadline, next(self._order), match.last_node))
        return match.num_tokens

    def pinned_nodes(self, now: float | None = None) -> dict[int, float]:
        """id(node) -> seconds its latest pin has left, for every pinned node (read only)."""
        now = time.monotonic() if now is None else now
        seconds_left: dict[int, float] = {}
        for deadline, _, node in self._deadlines:
            seconds_left[id(node)] = max(seconds_left.get(id(node), 0.0), deadline - now)
        return seconds_left

    def release_expired(self, now: float | None = None) -> int:
        """Unlock every pin whose deadline has passed; returns how many."""
        now = time.monotonic() if now is None else now
        num_released = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, node = heapq.heappop(self._deadlines)
            self.tree.unlock(node)
            num_released += 1
        return num_released

    def seconds_to_next_expiry(self, now: float | None = None) -> float | None:
        if not self._deadlines:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, self._deadlines[0][0] - now)

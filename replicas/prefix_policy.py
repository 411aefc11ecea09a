"""Which replica a request goes to: the longest cached prefix, unless load is imbalanced.

As SGLang's cache-aware router, with the prefix measured in chained page hashes:
  1. imbalanced load (max - min in-flight > balance_abs AND max > balance_rel * min):
     least loaded first, cache ignored, until the load evens out again;
  2. else, if some replica holds at least `min_match_ratio` of the request's pages (as
     SGLang's cache_threshold), the replica holding the most LEADING pages (ties: the
     affinity replica, then the least loaded);
  3. no replica holds that much: the affinity replica of the request's key
     (`prompt_cache_key` or a session header) if it is still there, else the least loaded.
Every decision ranks ALL candidates (best first), so Ray Serve falls back down the list when
the first is full. Pure Python: what Ray's RequestRouter (replicas/ray_router.py) delegates to.
"""

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from replicas.prefix_index import PrefixIndex

DEFAULT_BALANCE_ABS = 8  # requests in flight
DEFAULT_BALANCE_REL = 1.5
DEFAULT_MIN_MATCH_RATIO = 0.5  # of the request's full pages; below it a match is not worth the imbalance
DEFAULT_MAX_AFFINITY_KEYS = 100_000


@dataclass(frozen=True)
class RoutingThresholds:
    balance_abs: int = DEFAULT_BALANCE_ABS
    balance_rel: float = DEFAULT_BALANCE_REL
    min_match_ratio: float = DEFAULT_MIN_MATCH_RATIO

    def __post_init__(self):
        if self.balance_abs < 0:
            raise ValueError(f"balance_abs must be >= 0, got {self.balance_abs}")
        if self.balance_rel < 1:
            raise ValueError(f"balance_rel must be >= 1, got {self.balance_rel}")
        if not 0 <= self.min_match_ratio <= 1:
            raise ValueError(f"min_match_ratio must be in [0, 1], got {self.min_match_ratio}")


@dataclass(frozen=True)
class RoutingDecision:
    ranked_replica_ids: list[Hashable]  # every candidate, best first
    reason: str  # "prefix" | "affinity" | "least_loaded" | "imbalanced"
    num_matched_pages: int  # leading pages the first replica is believed to hold


class PrefixRoutingPolicy:
    def __init__(self, index: PrefixIndex | None = None, thresholds: RoutingThresholds = RoutingThresholds(),
                 max_affinity_keys: int = DEFAULT_MAX_AFFINITY_KEYS):
        self.index = index if index is not None else PrefixIndex()
        self.thresholds = thresholds
        self.max_affinity_keys = max_affinity_keys
        self._affinity: OrderedDict[str, Hashable] = OrderedDict()  # key -> replica, least recent first
        self._num_in_flight: dict[Hashable, int] = {}

    def num_in_flight(self, replica_id: Hashable) -> int:
        return self._num_in_flight.get(replica_id, 0)

    def is_imbalanced(self, replica_ids: Sequence[Hashable]) -> bool:
        loads = [self.num_in_flight(r) for r in replica_ids]
        if len(loads) < 2:
            return False
        max_load, min_load = max(loads), min(loads)
        return max_load - min_load > self.thresholds.balance_abs and max_load > self.thresholds.balance_rel * min_load

    def choose(self, replica_ids: Sequence[Hashable], page_hashes: Sequence[bytes],
               affinity_key: str | None = None) -> RoutingDecision:
        if not replica_ids:
            return RoutingDecision([], "least_loaded", 0)
        # Least loaded first; candidate order breaks exact ties (stable sort).
        by_load = sorted(replica_ids, key=self.num_in_flight)
        if self.is_imbalanced(replica_ids):
            return RoutingDecision(by_load, "imbalanced", self.index.num_leading_pages(by_load[0], page_hashes))
        affine = self._affinity.get(affinity_key) if affinity_key is not None else None
        matched = {r: self.index.num_leading_pages(r, page_hashes) for r in replica_ids}
        best = max(matched.values())
        if best > 0 and best >= self.thresholds.min_match_ratio * len(page_hashes):
            ranked = sorted(by_load, key=lambda r: (-matched[r], r != affine))
            return RoutingDecision(ranked, "prefix", best)
        if affine in matched:
            return RoutingDecision([affine] + [r for r in by_load if r != affine], "affinity", 0)
        return RoutingDecision(by_load, "least_loaded", 0)

    def record_routed(self, replica_id: Hashable, page_hashes: Sequence[bytes], affinity_key: str | None) -> None:
        """The request went to `replica_id`: it will hold these pages, and its key sticks there."""
        self._num_in_flight[replica_id] = self.num_in_flight(replica_id) + 1
        self.index.record_routed(replica_id, page_hashes)
        if affinity_key is not None:
            self._affinity[affinity_key] = replica_id
            self._affinity.move_to_end(affinity_key)
            while len(self._affinity) > self.max_affinity_keys:
                self._affinity.popitem(last=False)

    def record_finished(self, replica_id: Hashable) -> None:
        if self._num_in_flight.get(replica_id, 0) > 0:
            self._num_in_flight[replica_id] -= 1

    def drop_replica(self, replica_id: Hashable) -> None:
        """It died or left: forget its pages, its load and the keys that pointed at it."""
        self.index.drop(replica_id)
        self._num_in_flight.pop(replica_id, None)
        for key in [k for k, r in self._affinity.items() if r == replica_id]:
            del self._affinity[key]

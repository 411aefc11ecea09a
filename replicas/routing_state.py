"""The ingress's routing state: the prefix policy plus what the replicas last reported.

Owned by the ReplicaEngine (the ingress's engine handle) and reached by the Ray request
router through each request's ReplicaWork (the router runs in the ingress's process, on
Ray Serve's router thread): one lock guards it.
"""

import threading
from collections.abc import Hashable, Mapping, Sequence

from engine.metrics import EngineStats
from engine.stats_table import stats_from_dict
from replicas.prefix_policy import PrefixRoutingPolicy, RoutingDecision


class RoutingState:
    def __init__(self, policy: PrefixRoutingPolicy):
        self.policy = policy
        self._lock = threading.Lock()
        self._stats: dict[str, EngineStats] = {}  # replica id -> latest reported stats, live replicas only
        self._decisions: dict[str, int] = {}  # reason -> count

    def choose(self, replica_ids: Sequence[Hashable], page_hashes: Sequence[bytes],
               affinity_key: str | None) -> RoutingDecision:
        with self._lock:
            decision = self.policy.choose(replica_ids, page_hashes, affinity_key)
            self._decisions[decision.reason] = self._decisions.get(decision.reason, 0) + 1
            return decision

    def record_routed(self, replica_id: Hashable, page_hashes: Sequence[bytes], affinity_key: str | None) -> None:
        with self._lock:
            self.policy.record_routed(replica_id, page_hashes, affinity_key)

    def record_finished(self, replica_id: Hashable) -> None:
        with self._lock:
            self.policy.record_finished(replica_id)

    def sync_replicas(self, routing_stats: Mapping[str, dict]) -> None:
        """The live replicas and what each reported (Ray Serve's routing stats): forget the rest."""
        with self._lock:
            self.policy.index.keep_only(routing_stats)
            for replica_id in [r for r in self._stats if r not in routing_stats]:
                del self._stats[replica_id]
            for replica_id, stats in routing_stats.items():
                if "page_hashes_version" in stats:
                    self.policy.index.apply_snapshot(replica_id, stats["page_hashes_version"], stats["page_hashes"])
                if "engine_stats" in stats:
                    self._stats[replica_id] = stats_from_dict(EngineStats, stats["engine_stats"])

    def drop_replica(self, replica_id: str) -> None:
        with self._lock:
            self.policy.drop_replica(replica_id)
            self._stats.pop(replica_id, None)

    def stats_by_replica(self) -> dict[str, EngineStats]:
        with self._lock:
            return dict(self._stats)

    def decisions(self) -> dict[str, int]:
        with self._lock:
            return dict(self._decisions)

"""The Ray Serve request router that routes by cached prefix (Ray's custom RequestRouter API).

A thin adapter: the decision is PrefixRoutingPolicy's (through the ingress's RoutingState,
which each ReplicaWork carries in-process). It ranks every candidate, one per rank, so Ray
Serve tries the best first and goes down the list when a replica's queue is full. Replica
ids are `ReplicaID.unique_id`, the id a replica reports itself as.

A PrecomputeWork (document KV for one replica) goes to the replica it names: the ingress sends one
to each live replica, so every replica's document store holds a collection's chunks.

Lifecycle hooks: on_request_routed records the request's pages and key at its replica (and
its load), on_request_completed its end; update_replicas hands the live replicas' routing
stats (page hashes, engine stats) to the state; on_replica_actor_died drops the replica's
index, so nothing is routed there for its cache.
"""

import random
from typing import Optional

from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

from replicas.routing_state import RoutingState
from replicas.work import PrecomputeWork, ReplicaWork


def _work_of(pending_request: Optional[PendingRequest]) -> ReplicaWork | None:
    if pending_request is None or not pending_request.args:
        return None
    work = pending_request.args[0]
    return work if isinstance(work, ReplicaWork) else None


class PrefixCacheRequestRouter(RequestRouter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._state: RoutingState | None = None
        self._latest_routing_stats: dict[str, dict] = {}  # replica id -> its routing stats
        self._counted_request_ids: set[str] = set()  # routed requests whose load we count

    def _bind(self, work: ReplicaWork | PrecomputeWork | None) -> RoutingState | None:
        if self._state is None and work is not None and isinstance(work.routing, RoutingState):
            self._state = work.routing
            self._state.sync_replicas(self._latest_routing_stats)
        return self._state

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is not None and pending_request.args and isinstance(pending_request.args[0],
                                                                                PrecomputeWork):
            # one replica's share of a precompute: its target; any replica if the target is gone (a
            # replacement opens the dead one's disk directory and finds what it stored)
            self._bind(pending_request.args[0])  # the state learns of every live replica
            target = pending_request.args[0].replica_id
            chosen = [r for r in candidate_replicas if r.replica_id.unique_id == target]
            return [chosen] if chosen else [list(candidate_replicas)]
        work = _work_of(pending_request)
        state = self._bind(work)
        if state is None or work is None:  # not one of our requests (or routed from another process)
            shuffled = list(candidate_replicas)
            random.shuffle(shuffled)
            return [shuffled]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        decision = state.choose(list(by_id), work.page_hashes, work.affinity_key)
        return [[by_id[replica_id]] for replica_id in decision.ranked_replica_ids]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: ReplicaResult) -> None:
        work = _work_of(pending_request)
        state = self._bind(work)
        if state is not None and work is not None:
            state.record_routed(replica_id.unique_id, work.page_hashes, work.affinity_key)
            self._counted_request_ids.add(pending_request.metadata.internal_request_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        if self._state is not None and internal_request_id in self._counted_request_ids:
            self._counted_request_ids.discard(internal_request_id)
            self._state.record_finished(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._latest_routing_stats = {r.replica_id.unique_id: dict(r.routing_stats or {}) for r in replicas}
        if self._state is not None:
            self._state.sync_replicas(self._latest_routing_stats)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._latest_routing_stats.pop(replica_id.unique_id, None)
        if self._state is not None:
            self._state.drop_replica(replica_id.unique_id)

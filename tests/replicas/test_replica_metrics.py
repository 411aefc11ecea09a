"""Per-replica series come from the same metric table as the server's (engine/metrics.py), no Ray needed."""

import dataclasses

from engine.document_reuse_stats import DocumentReuseStats
from engine.metrics import STATS_METRICS, EngineStats
from replicas.prefix_policy import PrefixRoutingPolicy
from replicas.replica_metrics import ReplicaStatsCollector
from replicas.routing_state import RoutingState


def test_each_per_replica_series_reports_each_replica_from_the_one_table():
    routing = RoutingState(PrefixRoutingPolicy())
    a = EngineStats(num_admitted=2, num_prefilling=1, num_waiting=3, num_pages=10, num_free_pages=4,
                    num_cached_pages=5, num_held_pages=1, num_pages_in_use=4, num_prefix_query_tokens=100,
                    num_prefix_hit_tokens=60,
                    documents=DocumentReuseStats(num_reused_tokens=7, num_store_bytes=4096))
    b = dataclasses.replace(a, num_admitted=1, num_pages_in_use=1)
    routing.sync_replicas({"a": {"engine_stats": dataclasses.asdict(a)}, "b": {"engine_stats": dataclasses.asdict(b)}})
    families = {family.name: family for family in ReplicaStatsCollector(routing).collect()}
    per_replica = [m for m in STATS_METRICS if m.per_replica]
    assert {"radixserve:replica_" + m.name for m in per_replica} | {"radixserve:router_decisions"} == set(families)
    assert {m.name for m in per_replica} == {
        "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "kv_cache_cached_pages",
        "prefix_cache_queries", "prefix_cache_hits", "document_reuse_tokens", "document_reuse_store_bytes"}
    running = {s.labels["replica"]: s.value for s in families["radixserve:replica_num_requests_running"].samples}
    assert running == {"a": 2, "b": 1}
    usage = {s.labels["replica"]: s.value for s in families["radixserve:replica_kv_cache_usage_perc"].samples}
    assert usage == {"a": 0.4, "b": 0.1}

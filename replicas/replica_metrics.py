"""Per-replica Prometheus series (label `replica`), beside the server's aggregated ones.

The server's own gauges and counters read ReplicaEngine.stats(), the sum over live replicas;
these give each replica's share, from the same reports, and how the router decided.
"""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from replicas.routing_state import RoutingState

PREFIX = "radixserve:"

# (family, name, help, value from EngineStats)
_PER_REPLICA = (
    (GaugeMetricFamily, "replica_num_requests_running", "Requests admitted on the replica.", lambda s: s.num_admitted),
    (GaugeMetricFamily, "replica_num_requests_waiting", "Requests queued on the replica.", lambda s: s.num_waiting),
    (GaugeMetricFamily, "replica_kv_cache_usage_perc", "Share of the replica's KV pages in use (0..1).",
     lambda s: s.num_pages_in_use / s.num_pages if s.num_pages else 0.0),
    (GaugeMetricFamily, "replica_kv_cache_cached_pages", "KV pages the replica's prefix tree holds.",
     lambda s: s.num_cached_pages),
    (CounterMetricFamily, "replica_prefix_cache_queries", "Prompt tokens looked up in the replica's prefix cache.",
     lambda s: s.num_prefix_query_tokens),
    (CounterMetricFamily, "replica_prefix_cache_hits", "Prompt tokens found in the replica's prefix cache.",
     lambda s: s.num_prefix_hit_tokens),
    (CounterMetricFamily, "replica_document_reuse_tokens",
     "Prompt tokens whose KV came from the replica's document store.", lambda s: s.num_document_reused_tokens),
    (GaugeMetricFamily, "replica_document_reuse_store_bytes", "Bytes of KV the replica's document store holds.",
     lambda s: s.num_document_store_bytes),
)


class ReplicaStatsCollector(Collector):
    def __init__(self, routing: RoutingState):
        self._routing = routing

    def describe(self):
        return [family(PREFIX + name, doc, labels=["replica"]) for family, name, doc, _ in _PER_REPLICA] + [
            CounterMetricFamily(PREFIX + "router_decisions", "Routing decisions by reason.", labels=["reason"])]

    def collect(self):
        by_replica = self._routing.stats_by_replica()
        families = []
        for family, name, doc, value in _PER_REPLICA:
            metric = family(PREFIX + name, doc, labels=["replica"])
            for replica_id, stats in sorted(by_replica.items()):
                metric.add_metric([replica_id], value(stats))
            families.append(metric)
        decisions = CounterMetricFamily(PREFIX + "router_decisions", "Routing decisions by reason.", labels=["reason"])
        for reason, count in sorted(self._routing.decisions().items()):
            decisions.add_metric([reason], count)
        families.append(decisions)
        return families

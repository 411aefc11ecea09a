"""Per-replica Prometheus series (label `replica`), beside the server's aggregated ones.

The server's own gauges and counters read ReplicaEngine.stats(), the sum over live replicas;
these give each replica's share of the STATS_METRICS marked per_replica (engine/metrics.py: the one
table), from the same reports, as `replica_<name>`, and how the router decided.
"""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.metrics import STATS_METRICS
from replicas.routing_state import RoutingState

PREFIX = "radixserve:"
_FAMILIES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
_PER_REPLICA = tuple(m for m in STATS_METRICS if m.per_replica)


def _family(metric):
    return _FAMILIES[metric.kind](PREFIX + "replica_" + metric.name, metric.help + " (one replica's)",
                                  labels=["replica"])


class ReplicaStatsCollector(Collector):
    def __init__(self, routing: RoutingState):
        self._routing = routing

    def describe(self):
        return [_family(m) for m in _PER_REPLICA] + [
            CounterMetricFamily(PREFIX + "router_decisions", "Routing decisions by reason.", labels=["reason"])]

    def collect(self):
        by_replica = self._routing.stats_by_replica()
        families = []
        for metric in _PER_REPLICA:
            family = _family(metric)
            for replica_id, stats in sorted(by_replica.items()):
                family.add_metric([replica_id], metric.value(stats))
            families.append(family)
        decisions = CounterMetricFamily(PREFIX + "router_decisions", "Routing decisions by reason.", labels=["reason"])
        for reason, count in sorted(self._routing.decisions().items()):
            decisions.add_metric([reason], count)
        families.append(decisions)
        return families

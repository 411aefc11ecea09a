"""Each feature's stats dataclass is part of the one metric table: its `metric` fields and derived series
reach STATS_METRICS through EngineStats, and replicas' reports sum and travel field by field."""

import dataclasses
from types import SimpleNamespace

from cache.kv_tier import KVTierStats
from engine.document_reuse_stats import DocumentReuseStats
from engine.kv_disk_stats import KVDiskStats, kv_disk_stats
from engine.metrics import STATS_METRICS, EngineStats
from engine.speculation_stats import SpeculationStats
from engine.stats_table import stats_from_dict, sum_stats


def _stats(**features) -> EngineStats:
    return EngineStats(*([0] * 10), **features)


def test_a_features_series_are_read_from_its_own_stats():
    tier = SimpleNamespace(stats=lambda: KVTierStats(num_pages=2, num_bytes=8192, max_bytes=1 << 20,
                                                     num_dropped_pages=3))
    link = SimpleNamespace(tier=tier, num_query_tokens=64, num_hit_tokens=48)
    stats = _stats(kv_disk=kv_disk_stats(link), speculation=SpeculationStats(10, 6, 4))
    values = {metric.name: metric.value(stats) for metric in STATS_METRICS}
    assert (values["kv_disk_hits"], values["kv_disk_misses"], values["kv_disk_pages"]) == (48, 16, 2)
    assert values["kv_disk_dropped_pages"] == 3  # the tier's refused or failed writes
    assert values["spec_decode_mean_acceptance_length"] == 1 + 6 / 4
    assert kv_disk_stats(None) == KVDiskStats()  # no tier: all 0
    assert len({metric.name for metric in STATS_METRICS}) == len(STATS_METRICS)


def test_replica_reports_sum_and_travel_as_dicts():
    a = _stats(documents=DocumentReuseStats(num_reused_tokens=7), kv_disk=KVDiskStats(num_hit_tokens=16))
    b = dataclasses.replace(a, num_admitted=2, documents=DocumentReuseStats(num_reused_tokens=5))
    total = sum_stats(EngineStats, [a, b])
    assert (total.num_admitted, total.documents.num_reused_tokens, total.kv_disk.num_hit_tokens) == (2, 12, 32)
    assert stats_from_dict(EngineStats, dataclasses.asdict(b)) == b

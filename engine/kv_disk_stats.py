"""The disk tier's series (engine/kv_tier_link.py counts them; all 0 without a tier). A new counter of the
tier is a field here with its `metric(...)` and the line that reads it in `kv_disk_stats`."""

from dataclasses import dataclass
from typing import ClassVar

from engine.stats_table import StatsMetric, metric


@dataclass(frozen=True)
class KVDiskStats:
    num_query_tokens: int = 0  # full-page prompt tokens looked up past the tree's match
    num_hit_tokens: int = metric("kv_disk_hits", "counter",
                                 "Prompt tokens past the prefix tree's match loaded from the KV disk tier.", default=0)
    num_pages: int = metric("kv_disk_pages", "gauge", "KV pages in the disk tier.", default=0)
    num_bytes: int = metric("kv_disk_bytes", "gauge", "Bytes of KV page files in the disk tier.", default=0)
    num_dropped_pages: int = metric("kv_disk_dropped_pages", "counter",
                                    "KV page writes the disk tier refused (write queue full) or that failed.", default=0)

    DERIVED_METRICS: ClassVar[tuple[StatsMetric, ...]] = (
        StatsMetric("kv_disk_misses", "counter", "Prompt tokens past the prefix tree's match the KV disk tier lacked.",
                    lambda s: s.num_query_tokens - s.num_hit_tokens),
    )


def kv_disk_stats(link) -> KVDiskStats:
    """`link`: the engine's KVTierLink, or None (no tier)."""
    if link is None:
        return KVDiskStats()
    tier_stats = link.tier.stats()
    return KVDiskStats(num_query_tokens=link.num_query_tokens, num_hit_tokens=link.num_hit_tokens,
                       num_pages=tier_stats.num_pages, num_bytes=tier_stats.num_bytes,
                       num_dropped_pages=tier_stats.num_dropped_pages)

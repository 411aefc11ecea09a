"""Engine-side counters and latency samples, read by the server's /metrics.

Latencies are kept as running sums plus a bounded window of recent samples
(for percentiles), so memory stays flat however long the engine runs.

`EngineStats` is the snapshot /metrics reads: the scheduler's and the pool's series here, each
feature's in its own stats dataclass (engine/kv_disk_stats.py, engine/document_reuse_stats.py,
engine/speculation_stats.py), every series declared with `metric(...)` (engine/stats_table.py).
The server's /metrics (server/metrics.py) and the replicas' per-replica series
(replicas/replica_metrics.py) both iterate `STATS_METRICS`.
"""

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from engine.document_reuse_stats import DocumentReuseStats
from engine.kv_disk_stats import KVDiskStats
from engine.speculation_stats import SpeculationStats
from engine.stats_table import StatsMetric, metric, stats_metrics

WINDOW = 10_000  # recent samples kept per latency series


@dataclass
class LatencySeries:
    count: int = 0
    total_seconds: float = 0.0
    recent: deque = field(default_factory=lambda: deque(maxlen=WINDOW))

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total_seconds += seconds
        self.recent.append(seconds)

    def percentile(self, q: float) -> float | None:
        if not self.recent:
            return None
        ordered = sorted(self.recent)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


@dataclass
class EngineMetrics:
    time_to_first_token: LatencySeries = field(default_factory=LatencySeries)
    inter_token_latency: LatencySeries = field(default_factory=LatencySeries)
    queue_time: LatencySeries = field(default_factory=LatencySeries)
    e2e_latency: LatencySeries = field(default_factory=LatencySeries)
    kv_disk_load: LatencySeries = field(default_factory=LatencySeries)  # one page read from the disk tier
    kv_disk_store: LatencySeries = field(default_factory=LatencySeries)  # one page written (writer thread)
    document_disk_load: LatencySeries = field(default_factory=LatencySeries)  # one document span read from disk
    document_disk_store: LatencySeries = field(default_factory=LatencySeries)  # one span written (writer thread)
    prefill_seconds: float = 0.0  # wall time of steps that ran any prefill chunk
    decode_seconds: float = 0.0  # wall time of decode-only steps
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_finished_requests: int = 0
    # Speculation: draft tokens verified, of those accepted, verify chunks (a request's drafts in a step).
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    num_verify_chunks: int = 0
    # Observers registered by the server (e.g. Prometheus histograms), called
    # from the engine thread with (series_name, seconds).
    listeners: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, series: str, seconds: float) -> None:
        with self.lock:
            getattr(self, series).observe(seconds)
        for listener in self.listeners:
            listener(series, seconds)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's state, safe to read from any thread."""

    # what vLLM calls running: requests prefilling or decoding
    num_admitted: int = metric("num_requests_running", "gauge", "Requests admitted (prefilling or decoding), as vLLM counts.",
                               per_replica=True)
    num_prefilling: int = metric("num_requests_prefilling", "gauge",
                                 "Admitted requests whose prompt is not all in KV yet.")
    num_waiting: int = metric("num_requests_waiting", "gauge", "Requests queued for admission.", per_replica=True)
    num_pages: int = field()
    num_free_pages: int = field()
    num_cached_pages: int = metric("kv_cache_cached_pages", "gauge", "KV pages the prefix tree holds.",
                                   per_replica=True)
    num_held_pages: int = field()  # pages referenced by running requests only (not in the tree)
    num_pages_in_use: int = field()  # pages running requests use (their own + tree pages they lock)
    num_prefix_query_tokens: int = metric("prefix_cache_queries", "counter",
                                          "Prompt tokens looked up in the prefix cache.", per_replica=True)
    num_prefix_hit_tokens: int = metric("prefix_cache_hits", "counter", "Prompt tokens found in the prefix cache.",
                                        per_replica=True)
    num_preemptions: int = metric("num_preemptions", "counter",
                                  "Requests preempted for lack of KV pages (recomputed later).", default=0)
    num_evicted_pages: int = metric("kv_cache_evicted_pages", "counter", "Cached KV pages evicted from the prefix tree.",
                                    default=0)
    num_kv_cache_tokens: int = metric("kv_cache_capacity_tokens", "gauge",
                                      "Tokens the KV pool holds (its pages x page size, in its KV format).", default=0)
    # Each feature's series, in its own file (a new counter is one field there)
    kv_disk: KVDiskStats = field(default_factory=KVDiskStats)  # engine/kv_disk_stats.py
    documents: DocumentReuseStats = field(default_factory=DocumentReuseStats)  # engine/document_reuse_stats.py
    speculation: SpeculationStats = field(default_factory=SpeculationStats)  # engine/speculation_stats.py

    @property
    def kv_cache_usage(self) -> float:
        return self.num_pages_in_use / self.num_pages if self.num_pages else 0.0

    DERIVED_METRICS: ClassVar[tuple[StatsMetric, ...]] = (
        StatsMetric("kv_cache_usage_perc", "gauge", "Share of KV pages used by running requests (0..1).",
                    lambda s: s.kv_cache_usage, per_replica=True),
    )


# Every series /metrics reads from EngineStats (server/metrics.py; per replica: replicas/replica_metrics.py).
STATS_METRICS = stats_metrics(EngineStats)

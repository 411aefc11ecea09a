"""Engine-side counters and latency samples, read by the server's /metrics.

Latencies are kept as running sums plus a bounded window of recent samples
(for percentiles), so memory stays flat however long the engine runs.

`EngineStats` is the one metric table: each field that is a Prometheus series says so in its
metadata (`metric(...)`: name, gauge or counter, help; whether replicas report it per replica too),
and the few series computed from several fields are `DERIVED_METRICS`. The server's /metrics
(server/metrics.py) and the replicas' per-replica series (replicas/replica_metrics.py) both iterate
`STATS_METRICS`: a new counter is a field here and the line that fills it in engine/engine_stats.py.
"""

import dataclasses
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

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
class StatsMetric:
    """One Prometheus series read from EngineStats at scrape time (name without the `radixserve:` prefix)."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    value: Callable[["EngineStats"], float]
    per_replica: bool = False  # replicas also report it per replica, as `replica_<name>{replica=...}`


def metric(name: str, kind: str, help: str, per_replica: bool = False, **default) -> dataclasses.Field:
    """An EngineStats field that is a series of its own; `default=` as dataclasses.field's."""
    return field(metadata={"metric": (name, kind, help, per_replica)}, **default)


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
    # The disk tier (all 0 without one): full-page tokens looked up past the tree's match / loaded.
    num_kv_disk_query_tokens: int = 0
    num_kv_disk_hit_tokens: int = metric("kv_disk_hits", "counter",
                                         "Prompt tokens past the prefix tree's match loaded from the KV disk tier.",
                                         default=0)
    num_kv_disk_pages: int = metric("kv_disk_pages", "gauge", "KV pages in the disk tier.", default=0)
    num_kv_disk_bytes: int = metric("kv_disk_bytes", "gauge", "Bytes of KV page files in the disk tier.", default=0)
    # Document KV reuse (engine/document_reuse.py): spans and tokens placed from the store and not
    # recomputed, boundary (and selectively) recomputed tokens of reused spans, the store's size.
    num_document_reused_spans: int = metric("document_reuse_spans", "counter",
                                            "Document spans whose stored KV was placed into a prompt.", default=0)
    num_document_reused_tokens: int = metric("document_reuse_tokens", "counter",
                                             "Prompt tokens whose KV came from the document store, not computed.",
                                             per_replica=True, default=0)
    num_document_recomputed_tokens: int = metric(
        "document_reuse_recomputed_tokens", "counter",
        "Tokens of reused document spans recomputed (each span's first tokens, and selective recompute).", default=0)
    num_document_store_bytes: int = metric("document_reuse_store_bytes", "gauge", "Bytes of KV the document store holds.",
                                           per_replica=True, default=0)
    num_document_store_entries: int = metric("document_reuse_store_entries", "gauge", "Spans the document store holds.",
                                             default=0)
    # The store's entries on disk (0 without the disk tier): span lookups that missed memory and were
    # loaded from disk / missed there too; the files' bytes and count.
    num_document_disk_hits: int = metric(
        "document_reuse_disk_hits", "counter",
        "Document span lookups that missed the store's memory and were loaded from its disk copy.", default=0)
    num_document_disk_misses: int = metric(
        "document_reuse_disk_misses", "counter",
        "Document span lookups that missed the store's memory and its disk copy (or found it damaged).", default=0)
    num_document_disk_bytes: int = metric("document_reuse_disk_bytes", "gauge",
                                          "Bytes of the document store's span files on disk.", default=0)
    num_document_disk_entries: int = metric("document_reuse_disk_entries", "gauge",
                                            "Spans the document store holds on disk.", default=0)
    # Selective recompute (engine/selective_recompute.py; 0 when off): placed tokens recomputed after all
    # (also in num_document_recomputed_tokens), and positions its probe ran through the first layers.
    num_document_selective_recomputed_tokens: int = metric(
        "document_reuse_selective_recomputed_tokens", "counter",
        "Placed document tokens recomputed by selective recompute (--document-recompute-fraction).", default=0)
    num_document_probe_tokens: int = 0
    # Speculation (0 when off), as vLLM names it: drafts (a request's draft tokens verified in one step,
    # a verify chunk), their tokens, and the tokens accepted.
    num_spec_draft_tokens: int = metric("spec_decode_num_draft_tokens", "counter", "Draft tokens verified.", default=0)
    num_spec_accepted_tokens: int = metric("spec_decode_num_accepted_tokens", "counter", "Draft tokens accepted.",
                                           default=0)
    num_spec_verify_chunks: int = metric("spec_decode_num_drafts", "counter",
                                         "Drafts verified (one request's draft tokens in one step).", default=0)

    @property
    def spec_mean_acceptance_length(self) -> float:
        """Tokens a verify chunk emits on average: 1 + accepted / verify chunks (0 before any)."""
        if self.num_spec_verify_chunks == 0:
            return 0.0
        return 1 + self.num_spec_accepted_tokens / self.num_spec_verify_chunks

    @property
    def kv_cache_usage(self) -> float:
        return self.num_pages_in_use / self.num_pages if self.num_pages else 0.0


# Series computed from several fields.
DERIVED_METRICS = (
    StatsMetric("kv_cache_usage_perc", "gauge", "Share of KV pages used by running requests (0..1).",
                lambda s: s.kv_cache_usage, per_replica=True),
    StatsMetric("kv_disk_misses", "counter", "Prompt tokens past the prefix tree's match the KV disk tier lacked.",
                lambda s: s.num_kv_disk_query_tokens - s.num_kv_disk_hit_tokens),
    StatsMetric("spec_decode_mean_acceptance_length", "gauge",
                "Tokens a verified draft emitted on average (1 + accepted / drafts; 0 before any draft).",
                lambda s: s.spec_mean_acceptance_length),
)


def _field_metrics() -> tuple[StatsMetric, ...]:
    metrics = []
    for stats_field in dataclasses.fields(EngineStats):
        if "metric" in stats_field.metadata:
            name, kind, help, per_replica = stats_field.metadata["metric"]
            metrics.append(StatsMetric(name, kind, help, _getter(stats_field.name), per_replica))
    return tuple(metrics)


def _getter(name: str) -> Callable[[EngineStats], float]:
    return lambda stats: getattr(stats, name)


# Every series /metrics reads from EngineStats (server/metrics.py; per replica: replicas/replica_metrics.py).
STATS_METRICS = _field_metrics() + DERIVED_METRICS

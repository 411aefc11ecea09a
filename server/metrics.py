"""Prometheus metrics of one app, in its own registry (so a process can hold several apps).

Latency histograms are fed by the engine thread through `EngineMetrics.listeners`
(prometheus-client is thread-safe); gauges and prefix-cache counters are read from
`engine.stats()` when /metrics is scraped.
"""

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.engine_handle import EngineHandle
from engine.metrics import EngineStats

PREFIX = "radixserve:"
CONTENT_TYPE = CONTENT_TYPE_LATEST  # "text/plain; version=...; charset=utf-8"
# What the route hands Litestar, which appends "; charset=utf-8" to every text/ media type
# itself: passing CONTENT_TYPE would send charset twice, which strict scrapers reject.
MEDIA_TYPE = "; ".join(part.strip() for part in CONTENT_TYPE.split(";") if not part.strip().startswith("charset="))

# Buckets as vLLM's: seconds.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_KV_DISK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)

# EngineMetrics series name -> (metric name, help, buckets)
_HISTOGRAMS = {
    "time_to_first_token": ("time_to_first_token_seconds", "Time from arrival to the first token.", _TTFT_BUCKETS),
    "inter_token_latency": ("inter_token_latency_seconds", "Time between two tokens of a request.", _ITL_BUCKETS),
    "e2e_latency": ("e2e_request_latency_seconds", "Time from arrival to the last token.", _E2E_BUCKETS),
    "queue_time": ("request_queue_time_seconds", "Time from arrival to the first schedule.", _TTFT_BUCKETS),
    "kv_disk_load": ("kv_disk_load_seconds", "Time to read and check one KV page from the disk tier.",
                     _KV_DISK_BUCKETS),
    "kv_disk_store": ("kv_disk_store_seconds", "Time to write one KV page to the disk tier (writer thread).",
                      _KV_DISK_BUCKETS),
    "document_disk_load": ("document_reuse_disk_load_seconds",
                           "Time to read, check and load one document span from disk into the store.", _KV_DISK_BUCKETS),
    "document_disk_store": ("document_reuse_disk_store_seconds",
                            "Time to write one document span to disk (writer thread).", _KV_DISK_BUCKETS),
}


def _kv_cache_usage(stats: EngineStats) -> float:
    return stats.num_pages_in_use / stats.num_pages if stats.num_pages else 0.0


# (family, name, help, value from EngineStats)
_STATS_METRICS = (
    (GaugeMetricFamily, "num_requests_running", "Requests admitted (prefilling or decoding), as vLLM counts.",
     lambda s: s.num_admitted),
    (GaugeMetricFamily, "num_requests_prefilling", "Admitted requests whose prompt is not all in KV yet.",
     lambda s: s.num_prefilling),
    (GaugeMetricFamily, "num_requests_waiting", "Requests queued for admission.", lambda s: s.num_waiting),
    (GaugeMetricFamily, "kv_cache_usage_perc", "Share of KV pages used by running requests (0..1).",
     _kv_cache_usage),
    (GaugeMetricFamily, "kv_cache_cached_pages", "KV pages the prefix tree holds.", lambda s: s.num_cached_pages),
    (CounterMetricFamily, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
     lambda s: s.num_prefix_query_tokens),
    (CounterMetricFamily, "prefix_cache_hits", "Prompt tokens found in the prefix cache.",
     lambda s: s.num_prefix_hit_tokens),
    (CounterMetricFamily, "num_preemptions", "Requests preempted for lack of KV pages (recomputed later).",
     lambda s: s.num_preemptions),
    (CounterMetricFamily, "kv_cache_evicted_pages", "Cached KV pages evicted from the prefix tree.",
     lambda s: s.num_evicted_pages),
    (CounterMetricFamily, "kv_disk_hits", "Prompt tokens past the prefix tree's match loaded from the KV disk tier.",
     lambda s: s.num_kv_disk_hit_tokens),
    (CounterMetricFamily, "kv_disk_misses", "Prompt tokens past the prefix tree's match the KV disk tier lacked.",
     lambda s: s.num_kv_disk_query_tokens - s.num_kv_disk_hit_tokens),
    (GaugeMetricFamily, "kv_disk_bytes", "Bytes of KV page files in the disk tier.", lambda s: s.num_kv_disk_bytes),
    (GaugeMetricFamily, "kv_disk_pages", "KV pages in the disk tier.", lambda s: s.num_kv_disk_pages),
    (CounterMetricFamily, "document_reuse_spans", "Document spans whose stored KV was placed into a prompt.",
     lambda s: s.num_document_reused_spans),
    (CounterMetricFamily, "document_reuse_tokens", "Prompt tokens whose KV came from the document store, not computed.",
     lambda s: s.num_document_reused_tokens),
    (CounterMetricFamily, "document_reuse_recomputed_tokens",
     "Tokens of reused document spans recomputed (each span's first tokens, and selective recompute).",
     lambda s: s.num_document_recomputed_tokens),
    (CounterMetricFamily, "document_reuse_selective_recomputed_tokens",
     "Placed document tokens recomputed by selective recompute (--document-recompute-fraction).",
     lambda s: s.num_document_selective_recomputed_tokens),
    (GaugeMetricFamily, "document_reuse_store_bytes", "Bytes of KV the document store holds.",
     lambda s: s.num_document_store_bytes),
    (GaugeMetricFamily, "document_reuse_store_entries", "Spans the document store holds.",
     lambda s: s.num_document_store_entries),
    (CounterMetricFamily, "document_reuse_disk_hits",
     "Document span lookups that missed the store's memory and were loaded from its disk copy.",
     lambda s: s.num_document_disk_hits),
    (CounterMetricFamily, "document_reuse_disk_misses",
     "Document span lookups that missed the store's memory and its disk copy (or found it damaged).",
     lambda s: s.num_document_disk_misses),
    (GaugeMetricFamily, "document_reuse_disk_bytes", "Bytes of the document store's span files on disk.",
     lambda s: s.num_document_disk_bytes),
    (GaugeMetricFamily, "document_reuse_disk_entries", "Spans the document store holds on disk.",
     lambda s: s.num_document_disk_entries),
    # Speculation, as vLLM names it: drafts (a request's draft tokens verified in one step), their tokens, and
    # the tokens accepted; the mean acceptance length is the tokens a verified draft emits (1 + accepted / drafts).
    (CounterMetricFamily, "spec_decode_num_drafts", "Drafts verified (one request's draft tokens in one step).",
     lambda s: s.num_spec_verify_chunks),
    (CounterMetricFamily, "spec_decode_num_draft_tokens", "Draft tokens verified.", lambda s: s.num_spec_draft_tokens),
    (CounterMetricFamily, "spec_decode_num_accepted_tokens", "Draft tokens accepted.",
     lambda s: s.num_spec_accepted_tokens),
    (GaugeMetricFamily, "spec_decode_mean_acceptance_length",
     "Tokens a verified draft emitted on average (1 + accepted / drafts; 0 before any draft).",
     lambda s: s.spec_mean_acceptance_length),
)


class _EngineStatsCollector(Collector):
    """Gauges and counters read from the engine's latest stats snapshot at scrape time."""

    def __init__(self, engine: EngineHandle):
        self._engine = engine

    def describe(self):
        return [family(PREFIX + name, doc) for family, name, doc, _ in _STATS_METRICS]

    def collect(self):
        stats = self._engine.stats()
        return [family(PREFIX + name, doc, value=value(stats)) for family, name, doc, value in _STATS_METRICS]


class ServerMetrics:
    def __init__(self, engine: EngineHandle):
        self.registry = CollectorRegistry()
        self._engine = engine
        self._histograms = {series: Histogram(PREFIX + name, doc, buckets=buckets, registry=self.registry)
                            for series, (name, doc, buckets) in _HISTOGRAMS.items()}
        self.registry.register(_EngineStatsCollector(engine))
        for collector in engine.prometheus_collectors:  # the handle's own series (replicas/)
            self.registry.register(collector)
        engine.metrics.listeners.append(self._observe)

    def _observe(self, series: str, seconds: float) -> None:
        """Called from the engine thread."""
        histogram = self._histograms.get(series)
        if histogram is not None:
            histogram.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def close(self) -> None:
        if self._observe in self._engine.metrics.listeners:
            self._engine.metrics.listeners.remove(self._observe)

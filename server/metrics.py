"""Prometheus metrics of one app, in its own registry (so a process can hold several apps).

Latency histograms are fed by the engine thread through `EngineMetrics.listeners`
(prometheus-client is thread-safe); gauges and counters are engine/metrics.py's STATS_METRICS, read
from `engine.stats()` when /metrics is scraped.
"""

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.engine_handle import EngineHandle
from engine.metrics import STATS_METRICS

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


_FAMILIES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}


class _EngineStatsCollector(Collector):
    """Gauges and counters read from the engine's latest stats snapshot at scrape time."""

    def __init__(self, engine: EngineHandle):
        self._engine = engine

    def describe(self):
        return [_FAMILIES[m.kind](PREFIX + m.name, m.help) for m in STATS_METRICS]

    def collect(self):
        stats = self._engine.stats()
        return [_FAMILIES[m.kind](PREFIX + m.name, m.help, value=m.value(stats)) for m in STATS_METRICS]


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

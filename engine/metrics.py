"""Engine-side counters and latency samples, read by the server's /metrics.

Latencies are kept as running sums plus a bounded window of recent samples
(for percentiles), so memory stays flat however long the engine runs.
"""

import threading
from collections import deque
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
class EngineStats:
    """A snapshot of the engine's state, safe to read from any thread."""

    num_admitted: int  # requests prefilling or decoding (what vLLM calls running)
    num_prefilling: int  # of those, the ones whose prompt is not all in KV yet
    num_waiting: int
    num_pages: int
    num_free_pages: int
    num_cached_pages: int  # pages the prefix tree holds
    num_held_pages: int  # pages referenced by running requests only (not in the tree)
    num_pages_in_use: int  # pages running requests use (their own + tree pages they lock)
    num_prefix_query_tokens: int
    num_prefix_hit_tokens: int
    num_preemptions: int = 0  # requests preempted (freed, recomputed later) so far
    num_evicted_pages: int = 0  # cached pages the tree evicted so far
    # The disk tier (all 0 without one): full-page tokens looked up past the tree's match / loaded.
    num_kv_disk_query_tokens: int = 0
    num_kv_disk_hit_tokens: int = 0
    num_kv_disk_pages: int = 0
    num_kv_disk_bytes: int = 0
    # Document KV reuse (engine/document_reuse.py): spans and tokens placed from the store and not
    # recomputed, boundary (and selectively) recomputed tokens of reused spans, the store's size.
    num_document_reused_spans: int = 0
    num_document_reused_tokens: int = 0
    num_document_recomputed_tokens: int = 0
    num_document_store_bytes: int = 0
    num_document_store_entries: int = 0
    # The store's entries on disk (0 without the disk tier): span lookups that missed memory and were
    # loaded from disk / missed there too; the files' bytes and count.
    num_document_disk_hits: int = 0
    num_document_disk_misses: int = 0
    num_document_disk_bytes: int = 0
    num_document_disk_entries: int = 0
    # Selective recompute (engine/selective_recompute.py; 0 when off): placed tokens recomputed after all
    # (also in num_document_recomputed_tokens), and positions its probe ran through the first layers.
    num_document_selective_recomputed_tokens: int = 0
    num_document_probe_tokens: int = 0
    # Speculation (0 when off): drafts verified / accepted, verify chunks; the mean acceptance
    # length (tokens a verify chunk emits) is 1 + accepted / verify chunks.
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    num_spec_verify_chunks: int = 0

    @property
    def spec_mean_acceptance_length(self) -> float:
        if self.num_spec_verify_chunks == 0:
            return 0.0
        return 1 + self.num_spec_accepted_tokens / self.num_spec_verify_chunks

"""Document KV reuse's settings (engine/document_reuse.py runs it): stored spans' KV placed at any
position, K re-rotated; the store's bounds in memory and, with the disk tier, on disk."""

from dataclasses import dataclass

from engine.setting import parse_on_off, parse_size, setting, show_on_off, show_size

DEFAULT_DOCUMENT_STORE_BYTES = 1 << 30
# The document store's files in the disk tier's directory: a budget of their own beside the tier's bound, so
# precomputed collections never compete with pages for the tier's LRU.
DEFAULT_DOCUMENT_DISK_BYTES = 4 << 30


@dataclass(frozen=True)
class DocumentReuseConfig:
    # The default for requests that do not say (RequestOptions.document_reuse None). `serve`: on, since at
    # k = 4, 200 RAG prompts keep first-token agreement 0.975 and teacher-forced top-1 0.960 against exact
    # prefill (bench/document_reuse_quality.py, docs/performance.md); an engine built directly: exact KV only.
    enabled: bool = setting(
        False, "reuse the stored KV of a document (or a pasted passage) wherever it sits in a prompt: K re-rotated, "
        "the first tokens of each span recomputed, so derived, not exact, KV; a request may switch it off with "
        "\"document_reuse\": false", flag="--document-reuse", choices=("on", "off"), parse=parse_on_off,
        show=show_on_off, serve_default=True)
    store_bytes: int = setting(
        DEFAULT_DOCUMENT_STORE_BYTES, "bound of the document KV store, bytes like '1GiB'",
        flag="--document-store-memory", parse=parse_size, metavar="SIZE", show=show_size)
    # k: a span computed alone lacks its context, most in its first tokens (docs/performance.md)
    boundary_tokens: int = setting(
        4, "the first K tokens of each reused document span are recomputed", flag="--document-boundary-tokens",
        metavar="K")
    # r: CacheBlend-style selective recompute (engine/selective_recompute.py); 0.0: off
    recompute_fraction: float = setting(
        0.0, "also recompute the fraction R (0 to 1) of placed document tokens whose KV deviates most in the new "
        "context (CacheBlend-style: found by a probe through the first two layers; 0: off)",
        flag="--document-recompute-fraction", metavar="R")
    # With the disk tier: the store's entries are written to its directory too (documents/,
    # engine/document_kv_disk.py), within this many bytes of their own.
    disk_bytes: int = setting(
        DEFAULT_DOCUMENT_DISK_BYTES, "with the disk tier, the document KV store's entries are kept on disk too (in "
        "the tier's directory, documents/), within this bound of their own beside --kv-disk-bytes, least recently "
        "used deleted first", flag="--document-disk-bytes", parse=parse_size, metavar="SIZE", show=show_size)
    min_span_tokens: int = setting(
        64, "document spans shorter than N tokens are not stored or reused (their KV costs less to compute than "
        "to place)", flag="--document-min-span-tokens", metavar="N")

    def __post_init__(self):
        if self.store_bytes <= 0:
            raise ValueError(f"document store bytes must be positive, got {self.store_bytes}")
        if self.boundary_tokens < 0:
            raise ValueError(f"document boundary tokens must be >= 0, got {self.boundary_tokens}")
        if not 0.0 <= self.recompute_fraction <= 1.0:
            raise ValueError(f"document recompute fraction must be in [0, 1], got {self.recompute_fraction}")
        if self.disk_bytes <= 0:
            raise ValueError(f"document disk bytes must be positive, got {self.disk_bytes}")
        if self.min_span_tokens < 1:
            raise ValueError(f"document min span tokens must be >= 1, got {self.min_span_tokens}")

"""Document KV reuse's series (engine/document_reuse.py, the document store and its disk copy count them).
A new counter of the feature is a field here with its `metric(...)` and the line that reads it in
`document_reuse_stats`."""

from dataclasses import dataclass

from engine.stats_table import metric


@dataclass(frozen=True)
class DocumentReuseStats:
    # Spans and tokens placed from the store and not recomputed, boundary (and selectively) recomputed tokens
    # of reused spans, the store's size.
    num_reused_spans: int = metric("document_reuse_spans", "counter",
                                   "Document spans whose stored KV was placed into a prompt.", default=0)
    num_reused_tokens: int = metric("document_reuse_tokens", "counter",
                                    "Prompt tokens whose KV came from the document store, not computed.",
                                    per_replica=True, default=0)
    num_recomputed_tokens: int = metric(
        "document_reuse_recomputed_tokens", "counter",
        "Tokens of reused document spans recomputed (each span's first tokens, and selective recompute).", default=0)
    num_store_bytes: int = metric("document_reuse_store_bytes", "gauge", "Bytes of KV the document store holds.",
                                  per_replica=True, default=0)
    num_store_entries: int = metric("document_reuse_store_entries", "gauge", "Spans the document store holds.",
                                    default=0)
    # The store's entries on disk (0 without the disk tier): span lookups that missed memory and were loaded
    # from disk / missed there too; the files' bytes and count.
    num_disk_hits: int = metric(
        "document_reuse_disk_hits", "counter",
        "Document span lookups that missed the store's memory and were loaded from its disk copy.", default=0)
    num_disk_misses: int = metric(
        "document_reuse_disk_misses", "counter",
        "Document span lookups that missed the store's memory and its disk copy (or found it damaged).", default=0)
    num_disk_bytes: int = metric("document_reuse_disk_bytes", "gauge",
                                 "Bytes of the document store's span files on disk.", default=0)
    num_disk_entries: int = metric("document_reuse_disk_entries", "gauge", "Spans the document store holds on disk.",
                                   default=0)
    # Selective recompute (engine/selective_recompute.py; 0 when off): placed tokens recomputed after all (also
    # in num_recomputed_tokens), and positions its probe ran through the first layers.
    num_selective_recomputed_tokens: int = metric(
        "document_reuse_selective_recomputed_tokens", "counter",
        "Placed document tokens recomputed by selective recompute (--document-recompute-fraction).", default=0)
    num_probe_tokens: int = 0


def document_reuse_stats(documents, document_disk) -> DocumentReuseStats:
    """`documents`: the engine's DocumentReuse; `document_disk`: the store's disk copy, or None."""
    store, selective = documents.store, documents.selective
    disk = {}
    if document_disk is not None:
        disk_stats = document_disk.stats()
        disk = dict(num_disk_hits=store.num_tier_hits, num_disk_misses=store.num_tier_misses,
                    num_disk_bytes=disk_stats.num_bytes, num_disk_entries=disk_stats.num_files)
    return DocumentReuseStats(
        num_reused_spans=documents.num_reused_spans, num_reused_tokens=documents.num_reused_tokens,
        num_recomputed_tokens=documents.num_recomputed_tokens,
        num_selective_recomputed_tokens=documents.num_selectively_recomputed_tokens,
        num_probe_tokens=selective.num_probe_tokens if selective is not None else 0,
        num_store_bytes=store.num_bytes, num_store_entries=store.num_entries, **disk)

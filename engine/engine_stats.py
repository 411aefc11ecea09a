"""EngineStats of an LLMEngine: what its scheduler, caches, document store, tiers and speculation
counted so far, gathered in one place (engine/metrics.py defines the fields)."""

from engine.metrics import EngineStats


def engine_stats(engine) -> EngineStats:
    """The engine's counters and gauges now (read by the server's /metrics and by tests)."""
    scheduler = engine.scheduler
    allocator, tree = scheduler.allocator, scheduler.tree
    in_use = set()
    for request in scheduler.admitted:
        in_use.update(request.page_ids)
    num_free = allocator.num_free_pages
    return EngineStats(
        num_admitted=scheduler.num_admitted,
        num_prefilling=scheduler.num_prefilling,
        num_waiting=scheduler.num_waiting,
        num_pages=allocator.num_pages,
        num_free_pages=num_free,
        num_cached_pages=tree.num_cached_pages,
        num_held_pages=allocator.num_pages - num_free - tree.num_cached_pages,
        num_pages_in_use=len(in_use),
        num_prefix_query_tokens=scheduler.num_prefix_query_tokens,
        num_prefix_hit_tokens=scheduler.num_prefix_hit_tokens,
        num_preemptions=scheduler.num_preemptions,
        num_evicted_pages=tree.num_evicted_pages,
        num_kv_cache_tokens=allocator.num_pages * engine.kv_pool.page_size,
        num_document_reused_spans=engine.documents.num_reused_spans,
        num_document_reused_tokens=engine.documents.num_reused_tokens,
        num_document_recomputed_tokens=engine.documents.num_recomputed_tokens,
        num_document_selective_recomputed_tokens=engine.documents.num_selectively_recomputed_tokens,
        num_document_probe_tokens=_num_probe_tokens(engine.documents),
        num_document_store_bytes=engine.document_store.num_bytes,
        num_document_store_entries=engine.document_store.num_entries,
        **_document_disk_stats(engine),
        num_spec_draft_tokens=engine.metrics.num_draft_tokens,
        num_spec_accepted_tokens=engine.metrics.num_accepted_draft_tokens,
        num_spec_verify_chunks=engine.metrics.num_verify_chunks,
        **_kv_disk_stats(engine),
    )


def _kv_disk_stats(engine) -> dict:
    if engine.kv_tier is None:
        return {}
    tier_stats = engine.kv_tier.tier.stats()
    return dict(num_kv_disk_query_tokens=engine.kv_tier.num_query_tokens,
                num_kv_disk_hit_tokens=engine.kv_tier.num_hit_tokens,
                num_kv_disk_pages=tier_stats.num_pages, num_kv_disk_bytes=tier_stats.num_bytes)


def _document_disk_stats(engine) -> dict:
    if engine.document_disk is None:
        return {}
    disk_stats = engine.document_disk.stats()
    return dict(num_document_disk_hits=engine.document_store.num_tier_hits,
                num_document_disk_misses=engine.document_store.num_tier_misses,
                num_document_disk_bytes=disk_stats.num_bytes, num_document_disk_entries=disk_stats.num_files)


def _num_probe_tokens(documents) -> int:
    return documents.selective.num_probe_tokens if documents.selective is not None else 0

"""EngineStats of an LLMEngine: what its scheduler and caches counted so far, and each feature's own stats
(engine/kv_disk_stats.py, engine/document_reuse_stats.py, engine/speculation_stats.py read theirs)."""

from engine.document_reuse_stats import document_reuse_stats
from engine.kv_disk_stats import kv_disk_stats
from engine.metrics import EngineStats
from engine.speculation_stats import speculation_stats


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
        kv_disk=kv_disk_stats(engine.kv_tier),
        documents=document_reuse_stats(engine.documents, engine.document_disk),
        speculation=speculation_stats(engine.metrics),
    )


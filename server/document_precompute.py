"""Ingest computes each chunk's document KV as it is added: the first question about it pays no prefill.

A stored span is found again only by its exact token ids, so a chunk is precomputed with the ids its
text has inside a prompt (assembly/document_ranges.document_token_ids: the prompt builder's tokens of
the text, without the markup around it), which is what a `retrieval` prompt's exact span of that chunk
holds. The engine computes each id list alone and stores its spans (find_spans with the whole list
as one exact span: the same spans a prompt's exact span of it gets). A span already stored costs
nothing. Chunks go to the engine in batches, each one call between engine steps, so requests being
served keep running between them.
"""

import asyncio
from collections.abc import Callable, Sequence

from assembly.document_ranges import document_token_ids
from assembly.prompt_builder import PromptBuilder

PRECOMPUTE_BATCH_CHUNKS = 8


def precompute_skipped_reason(engine, document_reuse: bool) -> str | None:
    """Why added chunks get no KV computed, or None when they do: only where prompts can reuse it
    (document reuse on), and only with an engine handle that computes document KV (the replicas'
    handle does, into every replica, unless its router cannot reach each one: `precompute_unavailable`)."""
    if not document_reuse:
        return "document reuse is off on this server"
    if not hasattr(engine, "precompute_documents"):
        return "this server's engine computes no document KV"
    return getattr(engine, "precompute_unavailable", None)


async def precompute_chunks(engine, builder: PromptBuilder, texts: Sequence[str], cache_salt: str | None,
                            on_batch: Callable[[int], None] | None = None) -> int:
    """Tokens computed for the chunks' KV (0 for spans already stored); `on_batch(num_chunks)` after each batch."""
    num_computed = 0
    for start in range(0, len(texts), PRECOMPUTE_BATCH_CHUNKS):
        batch = texts[start:start + PRECOMPUTE_BATCH_CHUNKS]
        token_id_lists = await asyncio.to_thread(lambda: [document_token_ids(builder, {"text": t}) for t in batch])
        num_computed += await engine.precompute_documents(token_id_lists, cache_salt)
        if on_batch is not None:
            on_batch(len(batch))
    return num_computed

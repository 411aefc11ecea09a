"""Ingest computes each chunk's document KV as it is added: the first question about it pays no prefill.

A stored span is found again only by its exact token ids, so a chunk is precomputed with the ids its
text has inside a prompt (assembly/document_ranges.document_in_context: the prompt builder's tokens of
the text, without the markup around it), which is what a `retrieval` prompt's exact span of that chunk
holds. The engine computes each id list after the context a one-document prompt holds before it (the
template's system opening and the documents block up to the text), so its KV is what a prompt would
compute there (its first token is no attention sink), and stores its spans (find_spans with the whole
list as one exact span: the same spans a prompt's exact span of it gets), at their positions in that
prompt. The chunk is rendered as a retrieval prompt renders it (its id, its document's title), so the
context ends with its own markup (`<document id="doc#0">`); the engine keeps the context's last tokens
with the span (DocumentEntry.lead_ids), and a prompt that has the same markup before the chunk places
it too. The context before that markup is the same for every chunk: the prefix cache computes it
once. A span already stored costs nothing. Chunks go to the engine in batches, each one call between engine steps, so requests being
served keep running between them.
"""

import asyncio
from collections.abc import Callable, Sequence

from assembly.document_ranges import document_in_context
from assembly.prompt_builder import PromptBuilder
from engine.engine_handle import EngineHandle

PRECOMPUTE_BATCH_CHUNKS = 8


def precompute_skipped_reason(engine: EngineHandle, document_reuse: bool) -> str | None:
    """Why added chunks get no KV computed, or None when they do: only where prompts can reuse it
    (document reuse on), and only where the engine handle can (the replicas' handle computes it into
    every replica, unless its router cannot reach each one: `precompute_unavailable`)."""
    if not document_reuse:
        return "document reuse is off on this server"
    return engine.precompute_unavailable


async def precompute_chunks(engine: EngineHandle, builder: PromptBuilder, documents: Sequence[dict], cache_salt: str | None,
                            on_batch: Callable[[int], None] | None = None) -> int:
    """Tokens computed for the chunks' KV (0 for spans already stored); `documents` as the prompt
    builder renders them ({"id", "title"?, "text"}: server/rag_context.prompt_document);
    `on_batch(num_chunks)` after each batch."""
    num_computed = 0
    for start in range(0, len(documents), PRECOMPUTE_BATCH_CHUNKS):
        batch = documents[start:start + PRECOMPUTE_BATCH_CHUNKS]
        contexts, token_id_lists = await asyncio.to_thread(precompute_token_ids, builder, batch)
        num_computed += await engine.precompute_documents(token_id_lists, cache_salt, contexts)
        if on_batch is not None:
            on_batch(len(batch))
    return num_computed


def precompute_token_ids(builder: PromptBuilder, documents: Sequence[dict]) -> tuple[list[list[int]], list[list[int]]]:
    """(contexts, token id lists) of the documents, as precompute_documents takes them."""
    pairs = [document_in_context(builder, document) for document in documents]
    return [context for context, _ in pairs], [token_ids for _, token_ids in pairs]

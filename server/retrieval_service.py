"""The server's face of `retrieval`: collections and embeddings, off the event loop, errors as APIError.

Every call runs in a worker thread (SQLite and embedding block; embedding is CPU-heavy).
The embedding model is loaded on first use (the first embedding, ingest or search), not at
startup, so a server that never retrieves never pays for it.
"""

import asyncio
import functools
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path

from retrieval.collections import ChunkRow, CollectionInfo, Collections, DocumentRow, NewDocument, SearchHit
from retrieval.embedder import Embedder, EmbeddingBatch
from retrieval.errors import (CollectionExistsError, CollectionNotFoundError, DocumentNotFoundError,
                              EmbedderMismatchError, InvalidInputError, RetrievalError)
from server.errors import APIError, invalid_request

EMBEDDING_MODEL = "all-minilm-l6-v2"  # a name `store.model_store.pull` knows
EMBEDDING_MODEL_ALIASES = {EMBEDDING_MODEL, "sentence-transformers/all-minilm-l6-v2"}
MAX_DOCUMENTS_PER_REQUEST = 512
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit


def load_default_embedder() -> Embedder:
    from store.model_store import pull

    return Embedder(pull(EMBEDDING_MODEL, progress=False))


def _load_on(compute: Callable[[Callable], object], load_embedder: Callable[[], Embedder]) -> Embedder:
    """The embedder loaded through `compute`, and running its forward through it."""
    embedder = compute(load_embedder)
    embedder.compute = compute
    return embedder


class RetrievalService:
    def __init__(self, collections_dir: Path, load_embedder: Callable[[], Embedder] = load_default_embedder,
                 compute: Callable[[Callable], object] | None = None):
        """`compute` (work -> its result): where the embedding model is loaded and run; the in-process
        engine's thread (AsyncEngine.run_compute) in a server, inline when None."""
        self.collections = Collections(collections_dir, load_embedder if compute is None
                                       else functools.partial(_load_on, compute, load_embedder))

    async def create_collection(self, name: str, index_kind: str) -> CollectionInfo:
        return await self._run(self.collections.create, name, index_kind)

    async def list_collections(self) -> list[CollectionInfo]:
        return await self._run(self.collections.list_collections)

    async def collection(self, name: str) -> CollectionInfo:
        return await self._run(self.collections.info, name)

    async def delete_collection(self, name: str) -> None:
        await self._run(self.collections.delete, name)

    async def add_documents(self, name: str, documents: Sequence[NewDocument]) -> list[str]:
        if len(documents) > MAX_DOCUMENTS_PER_REQUEST:
            raise APIError(413, f"{len(documents)} documents in one request; at most {MAX_DOCUMENTS_PER_REQUEST}",
                           param="documents", code="batch_too_large")
        return await self._run(self.collections.add_documents, name, documents)

    async def document_chunks(self, name: str, document_ids: Sequence[str]) -> list[ChunkRow]:
        return await self._run(self.collections.document_chunks, name, document_ids)

    async def document(self, name: str, document_id: str) -> DocumentRow:
        return await self._run(self.collections.document, name, document_id)

    async def delete_document(self, name: str, document_id: str) -> None:
        await self._run(self.collections.delete_document, name, document_id)

    async def search(self, name: str, query: str, top_k: int) -> list[SearchHit]:
        return await self._run(self.collections.search, name, query, top_k)

    async def embed(self, inputs: list[str] | list[list[int]], model: str | None) -> EmbeddingBatch:
        """Texts or token-id lists (the embedding model's word-pieces); an input longer than the
        model's window is a 400, never silently truncated."""
        if model is not None and model.lower() not in EMBEDDING_MODEL_ALIASES:
            raise APIError(404, f"embedding model {model!r} does not exist; this server embeds with "
                           f"{EMBEDDING_MODEL}", param="model", code="model_not_found")
        if len(inputs) > MAX_EMBEDDING_INPUTS:
            raise APIError(413, f"{len(inputs)} inputs in one request; at most {MAX_EMBEDDING_INPUTS}",
                           param="input", code="batch_too_large")
        if inputs and isinstance(inputs[0], str):
            return await self._run(lambda: self.collections.embedder.embed(inputs, truncate=False))
        return await self._run(lambda: self.collections.embedder.embed_token_ids(inputs))

    @property
    def embedding_dim(self) -> int:
        return self.collections.embedder.dim

    async def close(self) -> None:
        await asyncio.to_thread(self.collections.close)

    async def _run(self, function: Callable, *args):
        with _as_api_errors():
            return await asyncio.to_thread(function, *args)


@contextmanager
def _as_api_errors():
    try:
        yield
    except InvalidInputError as error:
        raise invalid_request(str(error), param=error.param) from None
    except (CollectionNotFoundError, DocumentNotFoundError) as error:
        code = "collection_not_found" if isinstance(error, CollectionNotFoundError) else "document_not_found"
        raise APIError(404, str(error), code=code) from None
    except (CollectionExistsError, EmbedderMismatchError) as error:
        code = "collection_exists" if isinstance(error, CollectionExistsError) else "embedding_model_mismatch"
        raise APIError(409, str(error), code=code) from None
    except RetrievalError as error:
        raise invalid_request(str(error)) from None

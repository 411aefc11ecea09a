"""One collection: a directory holding its SQLite store (the truth) and its FAISS index (derived).

    <dir>/store.sqlite3   documents, chunks, embeddings (`CollectionStore`)
    <dir>/index.faiss     `VectorIndex` saved at some store version

The index in memory follows the store: a write made here updates it in place (or drops it
when it cannot be updated, e.g. a removal from HNSW); a write by another process shows up
as a version the index was not built at. Before every search the index is brought to the
store's version: kept, loaded from index.faiss when that file is at the version, else
rebuilt from the store's embeddings and saved (a corrupt file is rebuilt with a warning).

Thread-safe: one lock serialises store and index access; embedding (the slow part)
happens outside it. Closing (what deleting the collection does first) takes the lock too:
every call either finishes before the close (a write is then committed) or raises
CollectionNotFoundError.
"""

import logging
import threading
import uuid
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from retrieval.chunking import ChunkingConfig, TokenSpans, chunk_text
from retrieval.collection_store import (ChunkRow, CollectionStore, DocumentRow, EmbeddedDocument, WriteResult,
                                        chunk_name)
from retrieval.errors import CollectionNotFoundError, EmbedderMismatchError, InvalidInputError
from retrieval.vector_index import IndexFileError, VectorIndex

logger = logging.getLogger("radixserve.retrieval")

STORE_FILE = "store.sqlite3"
INDEX_FILE = "index.faiss"
INDEX_KINDS = ("auto", "flat", "hnsw")
HNSW_MIN_CHUNKS = 50_000  # "auto" collections switch from exact to HNSW search at this size
MAX_DOCUMENT_ID_CHARS = 512


class TextEmbedder(Protocol):
    """What a collection needs of `retrieval.embedder.Embedder`."""

    name: str
    dim: int
    max_chunk_tokens: int

    def token_spans(self, text: str) -> TokenSpans: ...

    def embed(self, texts: Sequence[str]): ...  # -> EmbeddingBatch (.vectors (N, dim) float32, unit rows)


@dataclass(frozen=True)
class NewDocument:
    text: str
    id: str | None = None  # None: a fresh uuid
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SearchHit:
    id: str  # the document's id
    position: int  # of the chunk in its document, from 0
    text: str  # the chunk's text
    score: float  # cosine similarity to the query, in [-1, 1]
    metadata: dict  # the document's

    @property
    def chunk_id(self) -> str:
        return chunk_name(self.id, self.position)


class IndexedCollection:
    def __init__(self, name: str, directory: Path, chunking: ChunkingConfig = ChunkingConfig()):
        self.name = name
        self.directory = directory
        self.chunking = chunking
        try:
            self._store = CollectionStore(directory / STORE_FILE)
        except FileNotFoundError:
            raise CollectionNotFoundError(f"collection {name!r} does not exist") from None
        self._index: VectorIndex | None = None
        self._is_index_saved = True
        self._is_closed = False
        self._lock = threading.RLock()

    # ---- reads ----

    def counts(self) -> tuple[int, int]:
        """(num_documents, num_chunks)"""
        with self._open_lock():
            return self._store.counts()

    def document(self, document_id: str) -> DocumentRow | None:
        with self._open_lock():
            return self._store.document(document_id)

    def document_chunks(self, document_ids: Sequence[str]) -> list[ChunkRow]:
        with self._open_lock():
            return self._store.document_chunks(document_ids)

    def search(self, query: str, top_k: int, embedder: TextEmbedder) -> list[SearchHit]:
        """The top_k chunks most similar to the query, best first (fewer when the collection is smaller)."""
        if not query.strip():
            raise InvalidInputError("query must not be empty", "query")
        if top_k < 1:
            raise InvalidInputError(f"top_k must be >= 1, got {top_k}", "top_k")
        with self._open_lock():
            self._check_embedder(embedder, record=False)
        return self.search_vector(embedder.embed([query]).vectors[0], top_k)

    def search_vector(self, query_vector: np.ndarray, top_k: int) -> list[SearchHit]:
        """query_vector (dim,) float32, unit -> the top_k most similar chunks, best first."""
        with self._open_lock():
            index = self._synced_index(query_vector.shape[0])
            hits = index.search(query_vector, top_k)
            rows = self._store.chunks(hits.chunk_ids.tolist())
        results = []
        for chunk_id, score in zip(hits.chunk_ids.tolist(), hits.scores.tolist()):
            row = rows.get(chunk_id)
            if row is not None:  # always, unless another process changed the store in between
                results.append(SearchHit(row.document_id, row.position, row.text, float(score), row.metadata))
        return results

    # ---- writes ----

    def add_documents(self, documents: Sequence[NewDocument], embedder: TextEmbedder) -> list[str]:
        """Chunk, embed and store the documents in one transaction; returns their ids in order.
        A document whose id exists replaces it."""
        ids = [d.id if d.id is not None else uuid.uuid4().hex for d in documents]
        _check_documents(documents, ids)
        chunk_lists = [chunk_text(d.text, embedder.token_spans(d.text), self._chunking_for(embedder))
                       for d in documents]
        flat_chunks = [c.text for chunks in chunk_lists for c in chunks]
        vectors = embedder.embed(flat_chunks).vectors  # (num_chunks, dim)
        embedded, start = [], 0
        for document, document_id, chunks in zip(documents, ids, chunk_lists):
            embedded.append(EmbeddedDocument(document_id, document.text, chunks,
                                             vectors[start:start + len(chunks)], dict(document.metadata)))
            start += len(chunks)
        with self._open_lock():
            self._check_embedder(embedder)
            self._apply(self._store.put_documents(embedded))
        return ids

    def delete_document(self, document_id: str) -> bool:
        """False when there is no such document."""
        with self._open_lock():
            result = self._store.delete_document(document_id)
            if result is not None:
                self._apply(result)
            return result is not None

    def sync_index(self, dim: int | None = None) -> None:
        """Bring the index to the store's version now (and save it), rather than at the next search."""
        with self._open_lock():
            dim = dim or int(self._store.meta("dim") or 0)
            if dim:
                self._synced_index(dim)
                self._save_index()

    def close(self) -> None:
        """Saves an index that changed since it was saved. Idempotent."""
        with self._lock:
            if self._is_closed:
                return
            self._save_index()
            self._store.close()
            self._is_closed = True

    # ---- the index ----

    def _synced_index(self, dim: int) -> VectorIndex:
        version = self._store.version()
        if self._index is not None and self._index.version == version:
            return self._index
        self._index = self._load_index(version)
        if self._index is None:
            self._index = self._rebuild_index(dim)
            self._save_index()
        return self._index

    def _load_index(self, version: int) -> VectorIndex | None:
        path = self.directory / INDEX_FILE
        try:
            index = VectorIndex.load(path)
        except FileNotFoundError:
            return None
        except IndexFileError as error:
            logger.warning("collection %r: index file is unreadable (%s); rebuilding it from the store",
                           self.name, error)
            return None
        if index.version != version or index.kind != self._wanted_kind(index.num_vectors):
            return None  # stale
        self._is_index_saved = True
        return index

    def _rebuild_index(self, dim: int) -> VectorIndex:
        version, chunk_ids, vectors = self._store.all_vectors(dim)
        self._is_index_saved = False
        return VectorIndex.build(self._wanted_kind(len(chunk_ids)), dim, version, chunk_ids, vectors)

    def _save_index(self) -> None:
        if self._index is not None and not self._is_index_saved:
            self._index.save(self.directory / INDEX_FILE)
            self._is_index_saved = True

    def _apply(self, result: WriteResult) -> None:
        """Bring the in-memory index along with a write just committed, when it can be done in place."""
        index = self._index
        if index is None or index.version != result.version_before:
            return  # not loaded, or already behind another process's write: rebuilt when next needed
        num_after = index.num_vectors - len(result.removed_chunk_ids) + len(result.added_chunk_ids)
        if (result.removed_chunk_ids and not index.can_remove) or index.kind != self._wanted_kind(num_after):
            self._index = None
            return
        index.remove(result.removed_chunk_ids)
        index.add(np.asarray(result.added_chunk_ids, dtype=np.int64), result.added_vectors)
        index.version = result.version_after
        self._is_index_saved = False

    def _wanted_kind(self, num_chunks: int) -> str:
        kind = self._store.meta("index_kind") or "auto"
        if kind == "auto":
            return "hnsw" if num_chunks >= HNSW_MIN_CHUNKS else "flat"
        return kind

    # ---- checks ----

    def _chunking_for(self, embedder: TextEmbedder) -> ChunkingConfig:
        if self.chunking.max_tokens <= embedder.max_chunk_tokens:
            return self.chunking
        return ChunkingConfig(embedder.max_chunk_tokens, min(self.chunking.overlap_tokens,
                                                             embedder.max_chunk_tokens - 1))

    def _check_embedder(self, embedder: TextEmbedder, record: bool = True) -> None:
        """The first write records the embedder; later ones (and searches) must use the same."""
        model, dim = self._store.meta("embedding_model"), self._store.meta("dim")
        if model is None:
            if record:
                self._store.set_meta({"embedding_model": embedder.name, "dim": str(embedder.dim)})
        elif model != embedder.name or int(dim) != embedder.dim:
            raise EmbedderMismatchError(f"collection {self.name!r} holds {model} embeddings ({dim} dims), "
                                        f"not {embedder.name} ({embedder.dim})")

    @contextmanager
    def _open_lock(self):
        """The lock, held, on a collection not closed. Checked after acquiring it: a delete closes
        the collection under the same lock, so a call that waited for it sees the close (a 404)
        rather than a closed store; a write that got the lock first commits before the close."""
        with self._lock:
            if self._is_closed:
                raise CollectionNotFoundError(f"collection {self.name!r} does not exist")
            yield


def _check_documents(documents: Sequence[NewDocument], ids: list[str]) -> None:
    if not documents:
        raise InvalidInputError("documents must not be empty", "documents")
    for i, (document, document_id) in enumerate(zip(documents, ids)):
        if not document.text.strip():
            raise InvalidInputError(f"documents[{i}].text must not be empty", f"documents[{i}].text")
        if not document_id or len(document_id) > MAX_DOCUMENT_ID_CHARS:
            raise InvalidInputError(f"documents[{i}].id must have 1 to {MAX_DOCUMENT_ID_CHARS} characters",
                                    f"documents[{i}].id")
    if len(set(ids)) != len(ids):
        raise InvalidInputError("document ids must be unique within one request", "documents")

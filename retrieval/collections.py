"""Named collections of documents for retrieval: the API the server, the CLI and RAG use.

    collections = Collections(root, load_embedder)        # load_embedder() -> Embedder, called once, lazily
    collections.create("docs")                            # CollectionExistsError, InvalidInputError (bad name)
    ids = collections.add_documents("docs", [NewDocument("text", id="a", metadata={...})])
    hits = collections.search("docs", "a question", top_k=4)
    # -> [SearchHit(id="a", position=0 (chunk_id "a#0"), text=<chunk>, score=0.83, metadata={...}), ...] best first
    collections.delete_document("docs", "a")              # DocumentNotFoundError
    collections.list_collections()                       # -> [CollectionInfo(name, num_documents, num_chunks)]
    collections.delete("docs")
    collections.close()                                   # saves indexes that changed

Layout: `root/<name>/` per collection (see `retrieval.indexed_collection`). A name is 1-64 of
[A-Za-z0-9._-], starting with a letter or digit: never a path. A collection directory is
built under a hidden temporary name and renamed into place, and removed by renaming it
to a hidden name first, so `root` only ever shows complete collections.

Every method may block (SQLite, embedding): call them off an event loop. Thread-safe.
Unknown names raise CollectionNotFoundError; all errors derive from RetrievalError.
"""

import re
import shutil
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from retrieval.chunking import ChunkingConfig
from retrieval.collection_store import ChunkRow, CollectionStore, DocumentRow
from retrieval.indexed_collection import (INDEX_KINDS, STORE_FILE, IndexedCollection, NewDocument, SearchHit,
                                          TextEmbedder)
from retrieval.errors import (CollectionExistsError, CollectionNotFoundError, DocumentNotFoundError,
                              InvalidInputError)

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_TOP_K = 100

__all__ = ["Collections", "CollectionInfo", "NewDocument", "SearchHit", "DocumentRow", "ChunkRow", "MAX_TOP_K"]


class CollectionInfo(NamedTuple):
    name: str
    num_documents: int
    num_chunks: int


class Collections:
    def __init__(self, root: Path, load_embedder: Callable[[], TextEmbedder],
                 chunking: ChunkingConfig = ChunkingConfig()):
        self.root = Path(root)
        self.chunking = chunking
        self._load_embedder = load_embedder
        self._embedder: TextEmbedder | None = None
        self._open: dict[str, IndexedCollection] = {}
        self._lock = threading.RLock()  # guards _open and creating / removing directories
        self._embedder_lock = threading.Lock()
        _remove_leftovers(self.root)

    @property
    def embedder(self) -> TextEmbedder:
        """The embedding model, loaded on first use."""
        with self._embedder_lock:
            if self._embedder is None:
                self._embedder = self._load_embedder()
            return self._embedder

    # ---- collections ----

    def create(self, name: str, index_kind: str = "auto") -> CollectionInfo:
        check_name(name)
        if index_kind not in INDEX_KINDS:
            raise InvalidInputError(f"index must be one of {', '.join(INDEX_KINDS)}, got {index_kind!r}", "index")
        with self._lock:
            target = self.root / name
            if target.exists():
                raise CollectionExistsError(f"collection {name!r} already exists")
            self.root.mkdir(parents=True, exist_ok=True)
            temp = self.root / f".{name}.creating-{uuid.uuid4().hex}"
            temp.mkdir()
            try:
                CollectionStore.create(temp / STORE_FILE, {"index_kind": index_kind}).close()
                temp.rename(target)  # fails when another process created it meanwhile
            except OSError:
                shutil.rmtree(temp, ignore_errors=True)
                if target.exists():
                    raise CollectionExistsError(f"collection {name!r} already exists") from None
                raise
        return CollectionInfo(name, 0, 0)

    def list_collections(self) -> list[CollectionInfo]:
        if not self.root.is_dir():
            return []
        infos = []
        for path in sorted(self.root.iterdir()):
            if NAME_PATTERN.fullmatch(path.name) and (path / STORE_FILE).is_file():
                try:
                    infos.append(self.info(path.name))
                except CollectionNotFoundError:  # deleted meanwhile
                    pass
        return infos

    def info(self, name: str) -> CollectionInfo:
        return CollectionInfo(name, *self._collection(name).counts())

    def delete(self, name: str) -> None:
        check_name(name)
        with self._lock:
            collection = self._open.pop(name, None)
            if collection is not None:
                collection.close()
            target = self.root / name
            if not (target / STORE_FILE).is_file():
                raise CollectionNotFoundError(f"collection {name!r} does not exist")
            doomed = self.root / f".{name}.deleted-{uuid.uuid4().hex}"
            target.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    # ---- documents ----

    def add_documents(self, name: str, documents: Sequence[NewDocument]) -> list[str]:
        """Chunk, embed and store in one transaction; returns the ids (an existing id is replaced)."""
        collection = self._collection(name)
        return collection.add_documents(documents, self.embedder)

    def document(self, name: str, document_id: str) -> DocumentRow:
        row = self._collection(name).document(document_id)
        if row is None:
            raise DocumentNotFoundError(f"document {document_id!r} is not in collection {name!r}")
        return row

    def document_chunks(self, name: str, document_ids: Sequence[str]) -> list[ChunkRow]:
        """The stored chunks of the documents (text as search returns it), document by document."""
        return self._collection(name).document_chunks(document_ids)

    def delete_document(self, name: str, document_id: str) -> None:
        if not self._collection(name).delete_document(document_id):
            raise DocumentNotFoundError(f"document {document_id!r} is not in collection {name!r}")

    def search(self, name: str, query: str, top_k: int) -> list[SearchHit]:
        """The top_k chunks of the collection most similar to the query, best first."""
        if not 1 <= top_k <= MAX_TOP_K:
            raise InvalidInputError(f"top_k must be in [1, {MAX_TOP_K}], got {top_k}", "top_k")
        return self._collection(name).search(query, top_k, self.embedder)

    def sync_index(self, name: str) -> None:
        """Build (or load) and save the collection's index now instead of at its first search."""
        self._collection(name).sync_index()

    def close(self) -> None:
        with self._lock:
            for collection in self._open.values():
                collection.close()
            self._open.clear()

    def _collection(self, name: str) -> IndexedCollection:
        check_name(name)
        with self._lock:
            collection = self._open.get(name)
            if collection is None or not (self.root / name / STORE_FILE).is_file():
                if collection is not None:  # removed by another process
                    collection.close()
                    del self._open[name]
                collection = IndexedCollection(name, self.root / name, self.chunking)
                self._open[name] = collection
            return collection


def check_name(name: str) -> None:
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidInputError(f"collection name {name!r} is not valid: use 1-64 letters, digits, '.', '_' "
                                "or '-', starting with a letter or digit", "name")


def _remove_leftovers(root: Path) -> None:
    """Directories a crashed delete left behind."""
    if root.is_dir():
        for path in root.glob(".*.deleted-*"):
            shutil.rmtree(path, ignore_errors=True)

"""One collection's documents, chunks, metadata and embeddings in SQLite: the source of truth.

Tables:
    meta       key -> value: `version` (bumped by every write), `index_kind`, `embedding_model`, `dim`
    documents  id (text) -> text, metadata (JSON object), num_chunks
    chunks     id (integer, never reused) -> document_id, position (0..num_chunks-1), text,
               start_char, end_char, embedding (float32 little-endian blob of `dim` values)

Durability: WAL journal with synchronous=FULL, so a committed write survives a kill -9 or a
power cut; every write is one transaction (a document and its chunks appear, change or go
together). Deleting a document deletes its chunks (ON DELETE CASCADE).

Not thread-safe by itself: the owning `IndexedCollection` serialises calls with its lock. Other
processes may write the same file at the same time (SQLite's locking, a 30 s busy timeout).
"""

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from retrieval.chunking import Chunk

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 30_000

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE documents (
    id TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL,
    num_chunks INTEGER NOT NULL
);
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    text TEXT NOT NULL,
    start_char INTEGER NOT NULL,
    end_char INTEGER NOT NULL,
    embedding BLOB NOT NULL
);
CREATE INDEX chunks_by_document ON chunks(document_id);
"""


@dataclass(frozen=True)
class EmbeddedDocument:
    """A document ready to store: its chunks and one vector per chunk."""

    id: str
    text: str
    chunks: list[Chunk]
    vectors: np.ndarray  # (len(chunks), dim) float32
    metadata: dict = field(default_factory=dict)


class WriteResult(NamedTuple):
    version_before: int  # the store's version when the write began
    version_after: int
    removed_chunk_ids: list[int]
    added_chunk_ids: list[int]
    added_vectors: np.ndarray  # (len(added_chunk_ids), dim) float32


def chunk_name(document_id: str, position: int) -> str:
    """"<document id>#<chunk position>", how the API names a chunk."""
    return f"{document_id}#{position}"


class ChunkRow(NamedTuple):
    chunk_id: int  # the row's id in the store
    document_id: str
    position: int
    text: str
    metadata: dict  # its document's

    @property
    def name(self) -> str:
        return chunk_name(self.document_id, self.position)


class DocumentRow(NamedTuple):
    id: str
    text: str
    metadata: dict
    num_chunks: int


class CollectionStore:
    def __init__(self, path: Path):
        """Opens an existing store; `create` makes a new one."""
        if not Path(path).is_file():
            raise FileNotFoundError(path)
        self.path = Path(path)
        self._db = _connect(self.path)

    @classmethod
    def create(cls, path: Path, meta: dict[str, str]) -> "CollectionStore":
        db = _connect(path)
        with _Transaction(db, "BEGIN IMMEDIATE"):
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            entries = {"schema": str(SCHEMA_VERSION), "version": "0", **meta}
            db.executemany("INSERT INTO meta VALUES (?, ?)", entries.items())
        db.close()
        return cls(path)

    def close(self) -> None:
        self._db.close()

    # ---- reads ----

    def version(self) -> int:
        return int(self.meta("version"))

    def meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def counts(self) -> tuple[int, int]:
        """(num_documents, num_chunks)"""
        with self._read():
            num_documents = self._db.execute("SELECT count(*) FROM documents").fetchone()[0]
            num_chunks = self._db.execute("SELECT count(*) FROM chunks").fetchone()[0]
        return num_documents, num_chunks

    def all_vectors(self, dim: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(version, chunk ids (N,) int64, vectors (N, dim) float32), one consistent snapshot."""
        with self._read():
            version = self.version()
            rows = self._db.execute("SELECT id, embedding FROM chunks ORDER BY id").fetchall()
        chunk_ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        vectors = np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), dim)
        return version, chunk_ids, vectors.astype(np.float32, copy=False)

    def chunks(self, chunk_ids: Sequence[int]) -> dict[int, ChunkRow]:
        if not chunk_ids:
            return {}
        marks = ",".join("?" * len(chunk_ids))
        rows = self._db.execute(
            f"SELECT c.id, c.document_id, c.position, c.text, d.metadata FROM chunks c "
            f"JOIN documents d ON d.id = c.document_id WHERE c.id IN ({marks})", [int(i) for i in chunk_ids])
        return {r[0]: ChunkRow(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows}

    def document_chunks(self, document_ids: Sequence[str]) -> list[ChunkRow]:
        """The chunks of the documents, document by document (in the order given), each in position order."""
        rows = []
        with self._read():
            for document_id in document_ids:
                rows += [ChunkRow(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in self._db.execute(
                    "SELECT c.id, c.document_id, c.position, c.text, d.metadata FROM chunks c "
                    "JOIN documents d ON d.id = c.document_id WHERE c.document_id = ? ORDER BY c.position",
                    (document_id,))]
        return rows

    def document(self, document_id: str) -> DocumentRow | None:
        row = self._db.execute("SELECT id, text, metadata, num_chunks FROM documents WHERE id = ?",
                               (document_id,)).fetchone()
        return None if row is None else DocumentRow(row[0], row[1], json.loads(row[2]), row[3])

    # ---- writes: each one transaction that bumps the version ----

    def set_meta(self, entries: dict[str, str]) -> None:
        """Descriptive entries (not `version`): no version bump, the indexed vectors do not change."""
        with _Transaction(self._db, "BEGIN IMMEDIATE"):
            self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", entries.items())

    def put_documents(self, documents: Sequence[EmbeddedDocument]) -> WriteResult:
        """Insert the documents; one whose id exists replaces it (its old chunks go)."""
        with self._write() as version_before:
            document_ids = [d.id for d in documents]
            removed = self._chunk_ids_of(document_ids)
            self._db.executemany("DELETE FROM documents WHERE id = ?", [(i,) for i in document_ids])
            added_ids, added_vectors = [], []
            for d in documents:
                self._db.execute("INSERT INTO documents VALUES (?, ?, ?, ?)",
                                 (d.id, d.text, json.dumps(d.metadata), len(d.chunks)))
                for position, (chunk, vector) in enumerate(zip(d.chunks, d.vectors, strict=True)):
                    cursor = self._db.execute(
                        "INSERT INTO chunks (document_id, position, text, start_char, end_char, embedding) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (d.id, position, chunk.text, chunk.start_char, chunk.end_char,
                         np.asarray(vector, dtype="<f4").tobytes()))
                    added_ids.append(cursor.lastrowid)
                    added_vectors.append(vector)
            dim = documents[0].vectors.shape[1] if documents else 0
            vectors = np.asarray(added_vectors, dtype=np.float32).reshape(len(added_ids), dim)
        return WriteResult(version_before, version_before + 1, removed, added_ids, vectors)

    def delete_document(self, document_id: str) -> WriteResult | None:
        """None when there is no such document (nothing changes then)."""
        try:
            return self._delete_document(document_id)
        except _NothingToDelete:
            return None

    def _delete_document(self, document_id: str) -> WriteResult:
        with self._write() as version_before:
            removed = self._chunk_ids_of([document_id])
            if self._db.execute("DELETE FROM documents WHERE id = ?", (document_id,)).rowcount == 0:
                raise _NothingToDelete
        return WriteResult(version_before, version_before + 1, removed, [], np.empty((0, 0), np.float32))

    def _chunk_ids_of(self, document_ids: Sequence[str]) -> list[int]:
        chunk_ids = []
        for document_id in document_ids:
            chunk_ids += [r[0] for r in self._db.execute("SELECT id FROM chunks WHERE document_id = ?",
                                                         (document_id,))]
        return chunk_ids

    def _read(self):
        return _Transaction(self._db, "BEGIN")

    def _write(self):
        return _Transaction(self._db, "BEGIN IMMEDIATE", bump_version=True)


class _NothingToDelete(Exception):
    """Rolls a write back (its version bump included)."""


class _Transaction:
    """`with`: BEGIN ... COMMIT, or ROLLBACK on an exception. A write yields the version before it
    and bumps it by one in the same transaction."""

    def __init__(self, db: sqlite3.Connection, begin: str, bump_version: bool = False):
        self.db, self.begin, self.bump_version = db, begin, bump_version

    def __enter__(self) -> int | None:
        self.db.execute(self.begin)
        if not self.bump_version:
            return None
        version = int(self.db.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()[0])
        self.db.execute("UPDATE meta SET value = ? WHERE key = 'version'", (str(version + 1),))
        return version

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None:
            self.db.execute("COMMIT")
            return False
        self.db.execute("ROLLBACK")
        return False


def _connect(path: Path) -> sqlite3.Connection:
    # Autocommit mode: transactions are explicit (`_Transaction`).
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA foreign_keys=ON")
    return db

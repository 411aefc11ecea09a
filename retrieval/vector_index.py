"""A collection's FAISS index: inner product over L2-normalised vectors (= cosine), keyed by chunk id.

Derived data: always rebuildable from the document store. Kinds:
    flat  exact search, `IndexIDMap2(IndexFlatIP)`; supports removal.
    hnsw  approximate, `IndexIDMap2(IndexHNSWFlat)`; cannot remove vectors, so a removal
          makes the owner rebuild it.

On disk (`save` / `load`), one file written atomically (temp file + rename):
    MAGIC | header length (4 bytes, little-endian) | header JSON | faiss's serialised index
The header records the store version the index was built at, its kind, dim, size and the
payload's CRC-32: a file whose version differs from the store's is stale, one whose CRC or
structure does not check out is corrupt (`IndexFileError`); both are rebuilt by the owner.
"""

import json
import os
import tempfile
import zlib
from pathlib import Path
from typing import NamedTuple

import faiss
import numpy as np

MAGIC = b"RSVIDX01"
KINDS = ("flat", "hnsw")
HNSW_NEIGHBOURS = 32  # M: links per node
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 64


class IndexFileError(Exception):
    """An index file that cannot be read back (truncated, corrupt, not ours)."""


class IndexHits(NamedTuple):
    chunk_ids: np.ndarray  # (k',) int64, best first, k' <= k (missing results dropped)
    scores: np.ndarray  # (k',) float32 inner products, in [-1, 1] for unit vectors


class VectorIndex:
    def __init__(self, kind: str, dim: int, version: int, index: faiss.Index | None = None):
        if kind not in KINDS:
            raise ValueError(f"index kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.dim = dim
        self.version = version  # the document store's version this index reflects
        self._index = index if index is not None else _new_index(kind, dim)

    @classmethod
    def build(cls, kind: str, dim: int, version: int, chunk_ids: np.ndarray, vectors: np.ndarray) -> "VectorIndex":
        index = cls(kind, dim, version)
        index.add(chunk_ids, vectors)
        return index

    @property
    def num_vectors(self) -> int:
        return self._index.ntotal

    @property
    def can_remove(self) -> bool:
        return self.kind == "flat"

    def add(self, chunk_ids: np.ndarray, vectors: np.ndarray) -> None:
        """chunk_ids (N,) int64, vectors (N, dim) float32, unit rows."""
        if len(chunk_ids):
            self._index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32),
                                     np.asarray(chunk_ids, dtype=np.int64))

    def remove(self, chunk_ids: list[int]) -> None:
        if chunk_ids and not self.can_remove:
            raise ValueError(f"a {self.kind} index cannot remove vectors; rebuild it")
        if chunk_ids:
            self._index.remove_ids(np.asarray(chunk_ids, dtype=np.int64))

    def search(self, query: np.ndarray, k: int) -> IndexHits:
        """query (dim,) float32, unit -> up to k nearest chunks. Not thread-safe (the owner locks)."""
        k = min(k, self.num_vectors)
        if k <= 0:
            return IndexHits(np.empty(0, np.int64), np.empty(0, np.float32))
        if self.kind == "hnsw":  # HNSW returns at most efSearch results
            faiss.downcast_index(self._index.index).hnsw.efSearch = max(HNSW_EF_SEARCH, k)
        scores, ids = self._index.search(np.asarray(query, dtype=np.float32).reshape(1, self.dim), k)
        found = ids[0] >= 0
        return IndexHits(ids[0][found], scores[0][found])

    def save(self, path: Path) -> None:
        payload = faiss.serialize_index(self._index).tobytes()
        header = json.dumps({"version": self.version, "kind": self.kind, "dim": self.dim,
                             "num_vectors": self.num_vectors, "crc32": zlib.crc32(payload)}).encode()
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + len(header).to_bytes(4, "little") + header)
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(temp, 0o644)
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path) -> "VectorIndex":
        """Raises FileNotFoundError when missing, IndexFileError when unreadable."""
        data = Path(path).read_bytes()
        try:
            if not data.startswith(MAGIC):
                raise ValueError("bad magic")
            header_len = int.from_bytes(data[len(MAGIC):len(MAGIC) + 4], "little")
            body = len(MAGIC) + 4 + header_len
            header = json.loads(data[len(MAGIC) + 4:body])
            payload = data[body:]
            if zlib.crc32(payload) != header["crc32"]:
                raise ValueError("checksum mismatch")
            index = faiss.deserialize_index(np.frombuffer(payload, dtype=np.uint8))
            if index.ntotal != header["num_vectors"] or index.d != header["dim"]:
                raise ValueError("header does not match the index")
            return cls(header["kind"], header["dim"], int(header["version"]), index)
        except (ValueError, KeyError, TypeError, RuntimeError) as error:  # faiss raises RuntimeError
            raise IndexFileError(f"{path}: {error}") from None


def _new_index(kind: str, dim: int) -> faiss.Index:
    if kind == "flat":
        return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    hnsw = faiss.IndexHNSWFlat(dim, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    hnsw.hnsw.efSearch = HNSW_EF_SEARCH
    return faiss.IndexIDMap2(hnsw)

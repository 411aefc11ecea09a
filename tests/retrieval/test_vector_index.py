"""FAISS index: exact and HNSW search, removal, the on-disk format and its checks."""

import numpy as np
import pytest

from retrieval.vector_index import IndexFileError, VectorIndex

DIM = 32


def _unit(rows: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((rows, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_search_finds_a_vector_itself_first(kind):
    vectors = _unit(500)
    ids = np.arange(1000, 1500, dtype=np.int64)
    index = VectorIndex.build(kind, DIM, 7, ids, vectors)
    hits = index.search(vectors[42], 5)
    assert hits.chunk_ids[0] == 1042 and hits.scores[0] == pytest.approx(1.0, abs=1e-5)
    assert list(hits.scores) == sorted(hits.scores, reverse=True) and len(hits.chunk_ids) == 5
    assert len(index.search(vectors[0], 10_000).chunk_ids) == 500


def test_flat_removes_hnsw_cannot():
    vectors = _unit(10)
    flat = VectorIndex.build("flat", DIM, 0, np.arange(10), vectors)
    flat.remove([3])
    assert 3 not in flat.search(vectors[3], 10).chunk_ids and flat.num_vectors == 9
    hnsw = VectorIndex.build("hnsw", DIM, 0, np.arange(10), vectors)
    with pytest.raises(ValueError):
        hnsw.remove([3])


def test_empty_index_returns_nothing():
    assert len(VectorIndex("flat", DIM, 0).search(_unit(1)[0], 3).chunk_ids) == 0


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_save_and_load(tmp_path, kind):
    vectors = _unit(100)
    index = VectorIndex.build(kind, DIM, 12, np.arange(100) * 3, vectors)
    index.save(tmp_path / "index.faiss")
    loaded = VectorIndex.load(tmp_path / "index.faiss")
    assert (loaded.kind, loaded.dim, loaded.version, loaded.num_vectors) == (kind, DIM, 12, 100)
    assert loaded.search(vectors[5], 1).chunk_ids.tolist() == [15]
    assert [p.name for p in tmp_path.iterdir()] == ["index.faiss"]  # no temp file left


@pytest.mark.parametrize("damage", ["garbage", "truncate", "flip"])
def test_unreadable_files_raise(tmp_path, damage):
    path = tmp_path / "index.faiss"
    VectorIndex.build("flat", DIM, 1, np.arange(50), _unit(50)).save(path)
    data = bytearray(path.read_bytes())
    if damage == "garbage":
        data = bytearray(b"not an index at all")
    elif damage == "truncate":
        data = data[:len(data) // 2]
    else:
        data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFileError):
        VectorIndex.load(path)
    with pytest.raises(FileNotFoundError):
        VectorIndex.load(tmp_path / "missing.faiss")

"""SQLite store: versions, replacement, cascading deletes, snapshots of the vectors."""

import numpy as np
import pytest

from retrieval.chunking import Chunk
from retrieval.collection_store import CollectionStore, EmbeddedDocument

DIM = 4


def _doc(document_id: str, num_chunks: int, seed: int = 0, metadata=None) -> EmbeddedDocument:
    rng = np.random.default_rng(seed)
    chunks = [Chunk(f"{document_id} part {i}", i * 10, i * 10 + 9, 3) for i in range(num_chunks)]
    text = " ".join(c.text for c in chunks)
    return EmbeddedDocument(document_id, text, chunks, rng.standard_normal((num_chunks, DIM)).astype(np.float32),
                            metadata or {})


@pytest.fixture
def store(tmp_path):
    store = CollectionStore.create(tmp_path / "store.sqlite3", {"index_kind": "flat"})
    yield store
    store.close()


def test_put_replace_delete(store):
    first = store.put_documents([_doc("a", 2), _doc("b", 3, metadata={"lang": "en"})])
    assert (first.version_before, first.version_after) == (0, 1) and store.version() == 1
    assert len(first.added_chunk_ids) == 5 and first.removed_chunk_ids == [] and first.added_vectors.shape == (5, DIM)
    assert store.counts() == (2, 5)
    assert store.document("b").metadata == {"lang": "en"} and store.document("b").num_chunks == 3

    replaced = store.put_documents([_doc("a", 1, seed=1)])
    assert sorted(replaced.removed_chunk_ids) == sorted(first.added_chunk_ids[:2])
    assert min(replaced.added_chunk_ids) > max(first.added_chunk_ids)  # chunk ids are never reused
    assert store.counts() == (2, 4)

    deleted = store.delete_document("b")
    assert sorted(deleted.removed_chunk_ids) == sorted(first.added_chunk_ids[2:])
    assert store.counts() == (1, 1) and store.version() == 3
    assert store.delete_document("b") is None and store.version() == 3  # nothing changed, no bump


def test_all_vectors_and_chunk_rows(store):
    doc = _doc("a", 3, metadata={"k": 1})
    result = store.put_documents([doc])
    version, chunk_ids, vectors = store.all_vectors(DIM)
    assert version == 1 and chunk_ids.tolist() == result.added_chunk_ids
    np.testing.assert_array_equal(vectors, doc.vectors)
    rows = store.chunks(chunk_ids[1:].tolist())
    assert [(r.document_id, r.position, r.text, r.metadata) for r in rows.values()] == [
        ("a", 1, "a part 1", {"k": 1}), ("a", 2, "a part 2", {"k": 1})]


def test_a_failed_write_changes_nothing(store):
    store.put_documents([_doc("a", 2)])
    bad = EmbeddedDocument("b", "b", [Chunk("b", 0, 1, 1)] * 2, np.zeros((1, DIM), np.float32))  # 2 chunks, 1 vector
    with pytest.raises(ValueError):
        store.put_documents([_doc("c", 1), bad])
    assert store.counts() == (1, 2) and store.version() == 1 and store.document("c") is None


def test_committed_writes_are_seen_by_a_new_connection(tmp_path, store):
    store.put_documents([_doc("a", 2)])
    other = CollectionStore(store.path)
    assert other.counts() == (1, 2) and other.version() == 1
    assert other.meta("index_kind") == "flat"
    other.close()

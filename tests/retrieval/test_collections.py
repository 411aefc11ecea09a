"""Collections on disk with a fake embedder: lifecycle, search, deletes, and the FAISS index
as derived data (loaded when current, rebuilt from SQLite when missing, stale or corrupt)."""

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from retrieval import indexed_collection as collection_module
from retrieval.indexed_collection import INDEX_FILE
from retrieval.collections import Collections, NewDocument
from retrieval.collection_store import CollectionStore
from retrieval.errors import (CollectionExistsError, CollectionNotFoundError, DocumentNotFoundError,
                              EmbedderMismatchError, InvalidInputError)
from retrieval.vector_index import VectorIndex

from .conftest import FakeEmbedder

TEXTS = {
    "cats": "Cats purr and sleep on warm windowsills all afternoon.",
    "rust": "The borrow checker enforces ownership rules at compile time in Rust.",
    "tea": "Green tea is steeped briefly in water below boiling point.",
}


@pytest.fixture
def collections(tmp_path, fake_embedder):
    collections = Collections(tmp_path / "collections", lambda: fake_embedder)
    yield collections
    collections.close()


def _add(collections, name="docs", texts=TEXTS):
    return collections.add_documents(name, [NewDocument(text, id) for id, text in texts.items()])


def test_lifecycle(collections, tmp_path):
    assert collections.list_collections() == []
    collections.create("docs")
    collections.create("other.v2_x-y")
    with pytest.raises(CollectionExistsError):
        collections.create("docs")
    assert _add(collections) == list(TEXTS)
    assert [(c.name, c.num_documents) for c in collections.list_collections()] == [("docs", 3), ("other.v2_x-y", 0)]
    collections.delete("docs")
    with pytest.raises(CollectionNotFoundError):
        collections.delete("docs")
    with pytest.raises(CollectionNotFoundError):
        collections.search("docs", "cats", 3)
    assert [c.name for c in collections.list_collections()] == ["other.v2_x-y"]
    assert sorted(os.listdir(tmp_path / "collections")) == ["other.v2_x-y"]  # no temporary or deleted leftovers


@pytest.mark.parametrize("name", ["", "../etc", ".hidden", "a/b", "a b", "x" * 65, "-dash", "é"])
def test_names_that_are_not_plain_are_refused(collections, name):
    with pytest.raises(InvalidInputError):
        collections.create(name)


def test_the_embedding_model_loads_only_when_needed(tmp_path):
    loads = []
    collections = Collections(tmp_path, lambda: loads.append(1) or FakeEmbedder())
    collections.create("docs")
    collections.list_collections()
    assert loads == []
    collections.add_documents("docs", [NewDocument("hello there")])
    collections.search("docs", "hello", 1)
    assert loads == [1]


def test_search_finds_a_document_by_its_own_words(collections):
    collections.create("docs")
    _add(collections)
    for document_id, text in TEXTS.items():
        hits = collections.search("docs", text, 3)
        assert hits[0].id == document_id and hits[0].chunk_id == f"{document_id}#0"
        assert hits[0].score == pytest.approx(1.0, abs=1e-5) and hits[0].text == text
    assert len(collections.search("docs", "anything", 100)) == 3


def test_long_documents_are_chunked_and_replaced_and_deleted_whole(collections, fake_embedder):
    collections.create("docs")
    long_text = " ".join(f"word{i}" for i in range(100))  # fake embedder: 16 tokens a chunk
    collections.add_documents("docs", [NewDocument(long_text, "long", {"source": "x"}), NewDocument("tiny one", "tiny")])
    info = collections.info("docs")
    assert info.num_documents == 2 and info.num_chunks > 7
    hit = collections.search("docs", "word50 word51 word52", 1)[0]
    assert hit.id == "long" and hit.chunk_id.startswith("long#") and "word51" in hit.text
    assert hit.metadata == {"source": "x"}

    collections.add_documents("docs", [NewDocument("short replacement", "long")])  # same id: replaced
    assert collections.info("docs").num_chunks == 2
    assert collections.search("docs", "word50 word51", 1)[0].text != hit.text
    collections.delete_document("docs", "long")
    assert collections.info("docs") == ("docs", 1, 1)
    assert [h.id for h in collections.search("docs", "short replacement", 5)] == ["tiny"]
    with pytest.raises(DocumentNotFoundError):
        collections.delete_document("docs", "long")


def test_bad_input(collections):
    collections.create("docs")
    for documents in ([], [NewDocument("  \n")], [NewDocument("a", "x"), NewDocument("b", "x")], [NewDocument("a", "")]):
        with pytest.raises(InvalidInputError):
            collections.add_documents("docs", documents)
    for top_k in (0, 101):
        with pytest.raises(InvalidInputError):
            collections.search("docs", "q", top_k)
    with pytest.raises(InvalidInputError):
        collections.search("docs", " ", 1)
    with pytest.raises(CollectionNotFoundError):
        collections.add_documents("nope", [NewDocument("a")])
    assert collections.info("docs").num_documents == 0


def test_another_embedding_model_is_refused(tmp_path):
    Collections(tmp_path, lambda: FakeEmbedder(dim=64)).create("docs")
    _add(Collections(tmp_path, lambda: FakeEmbedder(dim=64)))
    other = Collections(tmp_path, lambda: FakeEmbedder(dim=32))
    with pytest.raises(EmbedderMismatchError):
        other.add_documents("docs", [NewDocument("text")])
    with pytest.raises(EmbedderMismatchError):
        other.search("docs", "text", 1)


def _count_rebuilds(monkeypatch) -> list[int]:
    rebuilds = []
    original = VectorIndex.build.__func__

    def counting_build(cls, kind, dim, version, chunk_ids, vectors):
        rebuilds.append(version)
        return original(cls, kind, dim, version, chunk_ids, vectors)

    monkeypatch.setattr(VectorIndex, "build", classmethod(counting_build))
    return rebuilds


def test_the_saved_index_is_used_when_current(tmp_path, monkeypatch):
    first = Collections(tmp_path, FakeEmbedder)
    first.create("docs")
    _add(first)
    first.search("docs", "cats", 1)
    first.close()
    assert (tmp_path / "docs" / INDEX_FILE).is_file()
    rebuilds = _count_rebuilds(monkeypatch)
    second = Collections(tmp_path, FakeEmbedder)
    assert second.search("docs", TEXTS["tea"], 1)[0].id == "tea"
    assert rebuilds == []


@pytest.mark.parametrize("damage", ["missing", "stale", "corrupt"])
def test_the_index_is_rebuilt_from_sqlite(tmp_path, monkeypatch, caplog, damage):
    first = Collections(tmp_path, FakeEmbedder)
    first.create("docs")
    _add(first)
    first.search("docs", "cats", 1)
    first.close()
    index_path = tmp_path / "docs" / INDEX_FILE
    if damage == "missing":
        index_path.unlink()
    elif damage == "stale":  # a write the index file does not know of
        store = CollectionStore(tmp_path / "docs" / "store.sqlite3")
        with store._write():
            store._db.execute("DELETE FROM documents WHERE id = 'rust'")
        store.close()
    else:
        index_path.write_bytes(index_path.read_bytes()[:200])
    rebuilds = _count_rebuilds(monkeypatch)
    second = Collections(tmp_path, FakeEmbedder)
    with caplog.at_level(logging.WARNING, logger="radixserve.retrieval"):
        hits = second.search("docs", TEXTS["rust"], 3)
    assert rebuilds == [2 if damage == "stale" else 1]
    if damage == "stale":  # the rebuilt index no longer holds the deleted document
        assert {h.id for h in hits} == {"cats", "tea"}
    else:
        assert hits[0].id == "rust" and {h.id for h in hits} == set(TEXTS)
    warned = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(warned) == (1 if damage == "corrupt" else 0)
    assert VectorIndex.load(index_path).version == second._collection("docs")._store.version()  # saved again


def test_writes_by_another_process_are_seen(tmp_path):
    server = Collections(tmp_path, FakeEmbedder)
    server.create("docs")
    _add(server, texts={"cats": TEXTS["cats"]})
    assert server.search("docs", TEXTS["cats"], 1)[0].id == "cats"  # index now in memory
    cli = Collections(tmp_path, FakeEmbedder)
    _add(cli, texts={"tea": TEXTS["tea"]})
    cli.close()
    assert server.search("docs", TEXTS["tea"], 1)[0].id == "tea"
    _add(server, texts={"rust": TEXTS["rust"]})  # in place again
    assert server.search("docs", TEXTS["rust"], 1)[0].id == "rust"


@pytest.mark.parametrize("kind", ["hnsw", "auto"])
def test_hnsw_collections(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(collection_module, "HNSW_MIN_CHUNKS", 5)
    collections = Collections(tmp_path, FakeEmbedder)
    collections.create("docs", index_kind=kind)
    _add(collections)
    collections.search("docs", "x", 1)
    assert collections._collection("docs")._index.kind == ("hnsw" if kind == "hnsw" else "flat")  # 3 chunks
    collections.add_documents("docs", [NewDocument(f"extra document {i}", f"e{i}") for i in range(4)])
    assert collections.search("docs", TEXTS["tea"], 1)[0].id == "tea"
    assert collections._collection("docs")._index.kind == "hnsw"
    collections.delete_document("docs", "tea")  # HNSW cannot remove: rebuilt
    assert "tea" not in {h.id for h in collections.search("docs", TEXTS["tea"], 10)}


def test_a_failed_ingest_leaves_earlier_batches(tmp_path):
    class FailingEmbedder(FakeEmbedder):
        def embed(self, texts):
            if self.num_embedded:
                raise RuntimeError("out of memory")
            return super().embed(texts)

    collections = Collections(tmp_path, FailingEmbedder)
    collections.create("docs")
    _add(collections, texts={"cats": TEXTS["cats"]})
    with pytest.raises(RuntimeError):
        _add(collections, texts={"tea": TEXTS["tea"], "rust": TEXTS["rust"]})
    assert collections.info("docs").num_documents == 1


_INGEST_FOREVER = textwrap.dedent("""
    import sys, zlib
    from typing import NamedTuple
    import numpy as np
    from retrieval.chunking import TokenSpans
    from retrieval.collections import Collections, NewDocument

    class Batch(NamedTuple):
        vectors: np.ndarray
        num_tokens: list

    class Embedder:  # the tests' fake, without importing torch
        name, dim, max_chunk_tokens = "fake-bag-of-words", 64, 16
        def token_spans(self, text):
            words = text.split()
            offsets, at = [], 0
            for w in words:
                at = text.index(w, at)
                offsets.append((at, at + len(w)))
                at += len(w)
            return TokenSpans(offsets, list(range(len(words))))
        def embed(self, texts):
            v = np.zeros((len(texts), 64), np.float32)
            for r, t in enumerate(texts):
                for w in t.lower().split():
                    v[r, zlib.crc32(w.encode()) % 64] += 1
            return Batch(v / np.linalg.norm(v, axis=1, keepdims=True), [0] * len(texts))

    collections = Collections(sys.argv[1], Embedder)
    for batch in range(100000):
        ids = [f"b{batch}-{i}" for i in range(20)]
        texts = [" ".join(f"{id}-word{j}" for j in range(60)) for id in ids]  # several chunks each
        collections.add_documents("docs", [NewDocument(t, id) for t, id in zip(texts, ids)])
        print(" ".join(ids), flush=True)  # acknowledged
""")


@pytest.mark.slow
def test_an_ingest_killed_midway_keeps_every_acknowledged_document(tmp_path):
    Collections(tmp_path, FakeEmbedder).create("docs")
    process = subprocess.Popen([sys.executable, "-c", _INGEST_FOREVER, str(tmp_path)], stdout=subprocess.PIPE,
                               text=True)
    acknowledged = []
    deadline = time.monotonic() + 60
    while len(acknowledged) < 5 * 20 and time.monotonic() < deadline:
        acknowledged += process.stdout.readline().split()
    process.send_signal(signal.SIGKILL)
    process.wait()
    acknowledged += process.stdout.read().split()  # lines written before the kill

    collections = Collections(tmp_path, FakeEmbedder)
    num_documents = collections.info("docs").num_documents
    assert num_documents % 20 == 0 and num_documents >= len(acknowledged) >= 100  # whole batches only
    for document_id in acknowledged:
        assert collections.document("docs", document_id).num_chunks > 0
    last = acknowledged[-1]
    first_chunk = " ".join(collections.document("docs", last).text.split()[:16])  # the fake's chunk size
    hits = collections.search("docs", first_chunk, 1)
    assert hits[0].id == last  # the index was rebuilt from SQLite

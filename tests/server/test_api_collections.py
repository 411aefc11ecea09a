"""Collections and embeddings through HTTP against a real `radixserve serve` process on a
collections directory of its own: lifecycle, search, errors, and a kill -9 in the middle of
an ingest followed by a restart that finds every acknowledged write."""

import base64
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

API_KEY = "collections-key"
STARTUP_TIMEOUT_S = 180

DOCUMENTS = [
    {"id": "volcano", "text": "Volcanoes erupt molten rock called magma, which becomes lava at the surface.",
     "metadata": {"topic": "geology"}},
    {"id": "sourdough", "text": "A sourdough starter is a fermented mix of flour and water full of wild yeast."},
    {"id": "orbit", "text": "Satellites stay in orbit because they fall around the Earth as fast as it curves away."},
    {"id": "chess", "text": "In chess, castling moves the king two squares towards a rook in a single turn."},
]


class ServerProcess:
    """A `radixserve serve` subprocess on `collections_dir`; restartable on the same directory."""

    def __init__(self, collections_dir: Path, log_path: Path):
        self.collections_dir = collections_dir
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.base_url = ""

    def start(self) -> "ServerProcess":
        port = _free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--api-key", API_KEY,
                   "--kv-cache-memory", "32MiB", "--dtype", "float32", "--device", "cpu",
                   "--collections-dir", str(self.collections_dir),
                   "--kv-disk-dir", str(self.collections_dir.parent / "kv")]
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("server did not start:\n" + self.log_path.read_text()[-3000:])
            try:
                if httpx.get(self.base_url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.2)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: no shutdown code runs
        self.process.wait()

    def client(self, timeout: float = 120) -> httpx.Client:
        return httpx.Client(base_url=self.base_url + "/v1", headers={"Authorization": f"Bearer {API_KEY}"},
                            timeout=timeout)


_VOCABULARY = ("river mountain engine garden violin copper harbor winter lantern pepper thunder marble "
               "falcon orchard canyon velvet compass glacier meadow anchor saddle quartz ember tundra "
               "cobalt prairie walnut beacon meteor willow basalt pelican citrus harvest mirror nectar").split()


def _random_text(seed: str, num_words: int) -> str:
    import random

    return " ".join(random.Random(seed).choices(_VOCABULARY, k=num_words))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """One server for the module; tests that restart it leave a new one running."""
    directory = tmp_path_factory.mktemp("collections-server")
    server = ServerProcess(directory / "collections", directory / "server.log").start()
    yield server
    if server.process.poll() is None:
        server.stop()


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_create_ingest_search_delete(running):
    with running.client() as http:
        assert http.post("/collections", json={"name": "basics"}).status_code == 201
        assert _error(http.post("/collections", json={"name": "basics"}), 409)["code"] == "collection_exists"
        response = http.post("/collections/basics/documents",
                             json={"documents": DOCUMENTS + [{"text": "An id-less note about tides and the moon."}]})
        assert response.status_code == 200, response.text
        ids = response.json()["ids"]
        assert ids[:4] == [d["id"] for d in DOCUMENTS] and len(ids[4]) > 0

        listed = {c["name"]: c for c in http.get("/collections").json()["data"]}
        assert listed["basics"]["num_documents"] == 5 and listed["basics"]["num_chunks"] == 5

        for document in DOCUMENTS:  # a document's own words find it first
            words = " ".join(document["text"].split()[:8])
            hits = http.post("/collections/basics/search", json={"query": words, "top_k": 3}).json()["data"]
            assert hits[0]["id"] == document["id"] and hits[0]["chunk_id"] == document["id"] + "#0"
            assert hits[0]["text"] == document["text"] and hits[0]["metadata"] == document.get("metadata", {})
            assert len(hits) == 3 and hits[0]["score"] > hits[1]["score"]
        hits = http.post("/collections/basics/search", json={"query": "How do rockets stay up in space?"}).json()
        assert hits["data"][0]["id"] == "orbit"

        assert http.get("/collections/basics/documents/volcano").json()["metadata"] == {"topic": "geology"}
        assert http.delete("/collections/basics/documents/volcano").json()["deleted"] is True
        assert _error(http.get("/collections/basics/documents/volcano"), 404)["code"] == "document_not_found"
        hits = http.post("/collections/basics/search", json={"query": "magma and lava", "top_k": 10}).json()["data"]
        assert "volcano" not in {h["id"] for h in hits} and len(hits) == 4

        assert http.delete("/collections/basics").status_code == 200
        assert "basics" not in {c["name"] for c in http.get("/collections").json()["data"]}
        assert _error(http.post("/collections/basics/search", json={"query": "x"}), 404)["type"] == "not_found_error"


def test_bad_input(running):
    with running.client() as http:
        http.post("/collections", json={"name": "errors"})
        assert _error(http.post("/collections", json={"name": "../etc"}), 400)["param"] == "name"
        assert _error(http.post("/collections/nope/documents", json={"documents": [{"text": "x"}]}), 404)
        assert _error(http.post("/collections/nope/search", json={"query": "x"}), 404)
        assert _error(http.delete("/collections/nope"), 404)
        assert _error(http.delete("/collections/errors/documents/nope"), 404)["code"] == "document_not_found"
        empty = http.post("/collections/errors/documents", json={"documents": [{"text": "ok"}, {"text": "  "}]})
        assert _error(empty, 400)["param"] == "documents[1].text"
        assert _error(http.post("/collections/errors/documents", json={"documents": []}), 400)
        too_many = {"documents": [{"text": f"doc {i}"} for i in range(513)]}
        assert _error(http.post("/collections/errors/documents", json=too_many), 413)["code"] == "batch_too_large"
        for top_k in (0, 101, "3"):
            body = {"query": "x", "top_k": top_k}
            assert _error(http.post("/collections/errors/search", json=body), 400)["param"] == "top_k"
        assert _error(http.post("/collections/errors/search", json={"query": ""}), 400)["param"] == "query"
        assert http.get("/collections/errors").json()["num_documents"] == 0  # nothing half-written
    assert _error(httpx.get(running.base_url + "/v1/collections"), 401)  # behind the API key


def test_embeddings_in_openai_shape(running):
    import openai

    with openai.OpenAI(base_url=running.base_url + "/v1", api_key=API_KEY, max_retries=0) as client:
        texts = ["The cat sat on the mat.", "A cat was sitting on a rug.", "Quarterly tax filing rules."]
        result = client.embeddings.create(model="all-minilm-l6-v2", input=texts)  # base64 under the hood
        vectors = np.array([d.embedding for d in result.data])
        assert vectors.shape == (3, 384) and [d.index for d in result.data] == [0, 1, 2]
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
        assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
        assert result.usage.prompt_tokens == result.usage.total_tokens > 3 * 2
        single = client.embeddings.create(model="all-minilm-l6-v2", input=texts[2], encoding_format="float")
        assert np.allclose(single.data[0].embedding, vectors[2], atol=1e-5)
    with running.client() as http:
        raw = http.post("/embeddings", json={"input": texts[0], "encoding_format": "base64"}).json()
        decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
        assert np.allclose(decoded, vectors[0], atol=1e-5)
        assert _error(http.post("/embeddings", json={"input": "x", "model": "text-embedding-3-small"}), 404)
        assert _error(http.post("/embeddings", json={"input": ["ok", ""]}), 400)["param"] == "input"
        by_ids = http.post("/embeddings", json={"input": [1, 2, 3]}).json()  # word-piece ids, [CLS] [SEP] added
        assert len(by_ids["data"]) == 1 and by_ids["usage"]["prompt_tokens"] == 5
        assert _error(http.post("/embeddings", json={"input": "word " * 300}), 400)["param"] == "input"  # not truncated
        assert _error(http.post("/embeddings", json={"input": [1, "x"]}), 400)["param"] == "input"  # ids or text
        assert _error(http.post("/embeddings", json={"input": "x", "dimensions": 64}), 400)["param"] == "dimensions"
        assert _error(http.post("/embeddings", json={"input": ["x"] * 2049}), 413)


def test_a_kill_during_ingest_keeps_every_acknowledged_document_and_earlier_collections(running):
    """kill -9 while a batch is in flight, restart: acknowledged batches are all there, the one in
    flight is all there or not at all, another collection is as it was, and everything is searchable."""
    batch_size, num_words = 24, 80
    with running.client() as http:
        http.post("/collections", json={"name": "durable"})
        http.post("/collections/durable/documents", json={"documents": DOCUMENTS})
        before = http.post("/collections/durable/search", json={"query": "castling the king", "top_k": 4}).json()
        http.post("/collections", json={"name": "killed"})
    acknowledged: list[str] = []
    stop = threading.Event()

    def ingest_forever():
        with running.client() as http:
            for batch in range(10_000):
                documents = [{"id": f"b{batch}-{i}", "text": _random_text(f"b{batch}-{i}", num_words)}
                             for i in range(batch_size)]
                try:
                    # precompute off: the batch in flight is the store's (embed, commit), not the chat model's KV
                    response = http.post("/collections/killed/documents", json={"documents": documents,
                                                                                 "precompute": False})
                except httpx.TransportError:
                    return  # the server was killed mid-request: not acknowledged
                assert response.status_code == 200
                acknowledged.extend(response.json()["ids"])
                if stop.is_set():
                    return

    writer = threading.Thread(target=ingest_forever)
    writer.start()
    deadline = time.monotonic() + 120
    while len(acknowledged) < 3 * batch_size and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # the next batch is being embedded or committed now
    running.kill()
    stop.set()
    writer.join(timeout=60)
    assert len(acknowledged) >= 3 * batch_size

    running.start()
    with running.client() as http:
        num_documents = http.get("/collections/killed").json()["num_documents"]
        assert num_documents % batch_size == 0 and num_documents >= len(acknowledged)  # whole batches only
        for document_id in acknowledged:
            assert http.get(f"/collections/killed/documents/{document_id}").status_code == 200
        last = acknowledged[-1]
        words = http.get(f"/collections/killed/documents/{last}").json()["text"].split()
        hits = http.post("/collections/killed/search", json={"query": " ".join(words[:30]), "top_k": 1}).json()["data"]
        assert hits[0]["id"] == last

        assert http.get("/collections/durable").json()["num_documents"] == len(DOCUMENTS)
        after = http.post("/collections/durable/search", json={"query": "castling the king", "top_k": 4}).json()
        assert [h["id"] for h in after["data"]] == [h["id"] for h in before["data"]]
        assert [h["score"] for h in after["data"]] == pytest.approx([h["score"] for h in before["data"]], abs=1e-6)
    assert "unreadable" not in running.log_path.read_text()  # stale index files are rebuilt quietly

"""`radixserve ingest --server URL`: files through a running server's collections API, which
computes each chunk's document KV (the app with a fake engine, under uvicorn in a thread)."""

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from engine.document_reuse_config import DocumentReuseConfig
from engine.engine_config import EngineConfig
from server import cli

pytestmark = pytest.mark.model  # the default model's tokenizer and template (the app renders prompts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(make_fake_app, smollm2_dir, tmp_path):
    """(base URL, fake engines) of the fake app served over HTTP with document reuse on and an API key."""
    app, engines = make_fake_app("ok", engine=EngineConfig(model_dir=smollm2_dir, documents=DocumentReuseConfig(enabled=True)),
                                 collections_dir=tmp_path / "collections", api_key="ingest-key")
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the app did not start"
        time.sleep(0.05)
    yield base_url, engines
    server.should_exit = True
    thread.join(timeout=30)


def _notes(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "queues.md").write_text("A queue hands items from producers to consumers, first in first out.")
    (notes / "stacks.txt").write_text("A stack is last in first out: push puts an item on top, pop takes it.")
    (notes / "empty.txt").write_text("\n")
    return notes


def test_ingest_through_a_server_precomputes_the_chunks(served, tmp_path, capsys):
    base_url, engines = served
    notes = _notes(tmp_path)
    argv = ["ingest", "kb", str(notes), "--server", base_url, "--api-key", "ingest-key", "--quiet"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    [(token_id_lists, salt)] = engines[0].precomputed
    assert len(token_id_lists) == 2 and salt is None
    assert "2 files ingested (1 empty)" in out and "2 documents, 2 chunks" in out
    assert f"{sum(len(ids) for ids in token_id_lists)} tokens of document KV computed" in out
    hits = httpx.post(f"{base_url}/v1/collections/kb/search", json={"query": "producers and consumers"},
                      headers={"Authorization": "Bearer ingest-key"}).json()["data"]
    assert hits[0]["id"] == "notes/queues.md" and hits[0]["metadata"] == {"path": str(notes / "queues.md")}

    assert cli.main([*argv, "--no-precompute"]) == 0  # again: replaced, and no KV computed this time
    assert "0 tokens of document KV computed" in capsys.readouterr().out
    assert len(engines[0].precomputed) == 1


def test_ingest_through_a_server_errors_are_one_line(served, tmp_path, capsys):
    base_url, _ = served
    notes = _notes(tmp_path)
    assert cli.main(["ingest", "kb", str(notes), "--server", base_url, "--api-key", "wrong", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("radixserve: error: ") and "401" in err[0]
    assert cli.main(["ingest", "../bad", str(notes), "--server", base_url, "--api-key", "ingest-key",
                     "--quiet"]) == 1
    assert "400" in capsys.readouterr().err
    assert cli.main(["ingest", "kb", str(notes), "--server", f"http://127.0.0.1:{_free_port()}", "--quiet"]) == 1
    assert "cannot reach the server" in capsys.readouterr().err

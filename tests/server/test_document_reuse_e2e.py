"""Document reuse end to end on the real default model, through `radixserve serve --document-reuse on`:
documents sent in another order and a passage pasted after other text reuse their stored KV (usage
and metrics say so), and `"document_reuse": false` gets exact KV only."""

import re

import httpx
import pytest

from bench import corpus
from tests.server.conftest import serving

pytestmark = [pytest.mark.model, pytest.mark.slow]

QUESTION = [{"role": "user", "content": "Summarize the documents."}]


@pytest.fixture(scope="module")
def reuse_server(tmp_path_factory):
    server_dir = tmp_path_factory.mktemp("document-reuse")
    with serving(server_dir, ["--document-reuse", "on", "--no-kv-disk",
                              "--collections-dir", str(server_dir / "collections")]) as running:
        yield running


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return list(corpus.documents(5, 150))


def _chat(server, **body) -> dict:
    response = httpx.post(server.api_url + "/chat/completions", timeout=600,
                          json={"model": server.model, "max_tokens": 2, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def _metric(server, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return float(re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE).group(1))


def test_documents_in_another_order_reuse_their_kv(reuse_server, texts):
    first = _chat(reuse_server, messages=QUESTION, documents=[{"text": t} for t in texts[:3]])
    assert first["prompt_tokens_details"]["reused_document_tokens"] == 0
    # texts[2] and texts[1] now follow a document never seen: no prefix hit reaches them
    again = [{"text": texts[4]}, {"text": texts[2]}, {"text": texts[1]}]
    before = _metric(reuse_server, "radixserve:document_reuse_tokens_total")
    reused = _chat(reuse_server, messages=QUESTION, documents=again)["prompt_tokens_details"]
    assert reused["reused_document_tokens"] > 200
    assert reused["cached_tokens"] >= reused["reused_document_tokens"]
    assert _metric(reuse_server, "radixserve:document_reuse_tokens_total") - before == reused["reused_document_tokens"]
    assert _metric(reuse_server, "radixserve:document_reuse_store_entries") > 0

    exact = _chat(reuse_server, messages=QUESTION, documents=again, document_reuse=False)
    assert exact["prompt_tokens_details"]["reused_document_tokens"] == 0


def test_a_pasted_passage_after_other_text_reuses_its_kv(reuse_server, texts):
    def pasted(first: str, second: str) -> list[dict]:
        context = f"Document [1]:\n{first}\n\nDocument [2]:\n{second}"
        return [{"role": "system", "content": f"Answer from these documents.\n\n{context}"}, *QUESTION]

    _chat(reuse_server, messages=pasted(texts[0], texts[3]))
    usage = _chat(reuse_server, messages=pasted(texts[4], texts[3]))  # texts[3] at another offset
    assert usage["prompt_tokens_details"]["reused_document_tokens"] > 64

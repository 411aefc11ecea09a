"""Document reuse through the HTTP app (fake engine): the per-request switch in every API, and the
exact spans of `documents` and `retrieval` that reach the engine."""

import dataclasses
import json

import pytest

from engine.document_reuse_config import DocumentReuseConfig
from engine.document_reuse_stats import DocumentReuseStats
from engine.engine_config import EngineConfig

MODEL = "fake-model"
QUESTION = [{"role": "user", "content": "What do the documents say?"}]
DOCUMENTS = [
    {"id": "queues", "text": "A queue hands items from producers to consumers, first in first out, "
                             "and blocks a consumer while it is empty."},
    {"id": "stacks", "title": "Stacks", "text": "A stack is last in first out: push puts an item on top, "
                                                "pop takes the top one off."},
    {"text": "Heaps keep their smallest item first; pushing and popping cost a logarithm of their size."},
]


@pytest.fixture
def reuse_client(make_client, smollm2_dir, tmp_path):
    """A client of an app whose engine config has document reuse on (the fake engine records options)."""
    return make_client("ok", engine=EngineConfig(model_dir=smollm2_dir, documents=DocumentReuseConfig(enabled=True)),
                       collections_dir=tmp_path)


def _span_texts(engine, tokenizer) -> list[str]:
    prompt, options = engine.prompts[-1], engine.options[-1]
    return [tokenizer.decode(prompt[start:end], skip_special_tokens=False) for start, end in options.document_spans]


def test_documents_spans_cover_exactly_each_documents_text(reuse_client, tokenizer):
    client, engine = reuse_client
    response = client.post("/v1/chat/completions", json={"messages": QUESTION, "documents": DOCUMENTS})
    assert response.status_code == 200, response.text
    assert _span_texts(engine, tokenizer) == [document["text"] for document in DOCUMENTS]
    spans = engine.options[-1].document_spans
    for start, end in spans:  # exactly the text's own tokens: the text tokenized alone
        text = tokenizer.decode(engine.prompts[-1][start:end])
        assert engine.prompts[-1][start:end] == tokenizer.encode(text)
    assert engine.options[-1].document_reuse is None  # the server's default


def test_retrieved_chunks_spans_cover_exactly_their_text(reuse_client, tokenizer):
    client, engine = reuse_client
    assert client.post("/v1/collections", json={"name": "ds"}).status_code == 201
    assert client.post("/v1/collections/ds/documents", json={"documents": DOCUMENTS}).status_code == 200
    body = {"messages": QUESTION, "documents": DOCUMENTS[:1], "retrieval": {"collection": "ds", "top_k": 2}}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    retrieved = [d["id"] for d in response.json()["retrieved_documents"]]
    texts = {d.get("id"): d["text"] for d in DOCUMENTS}
    # the request's own document first, then the retrieved chunks (each a whole document here)
    assert _span_texts(engine, tokenizer) == [DOCUMENTS[0]["text"], *(texts[i] for i in retrieved)]


def test_no_spans_when_reuse_is_off_for_the_server_or_the_request(make_client, reuse_client):
    client, engine = make_client("ok")  # the default config: document reuse off
    assert client.post("/v1/chat/completions", json={"messages": QUESTION, "documents": DOCUMENTS}).status_code == 200
    assert engine.options[-1].document_spans == () and engine.options[-1].document_reuse is None
    client, engine = reuse_client
    response = client.post("/v1/chat/completions", json={"messages": QUESTION, "documents": DOCUMENTS,
                                                         "document_reuse": False})
    assert response.status_code == 200
    assert engine.options[-1].document_spans == () and engine.options[-1].document_reuse is False


REQUESTS = {
    "/v1/chat/completions": {"messages": QUESTION, "max_tokens": 2},
    "/v1/completions": {"prompt": "Once upon a time", "max_tokens": 2},
    "/v1/responses": {"model": MODEL, "input": "What do the documents say?", "max_output_tokens": 2},
    "/v1/messages": {"model": MODEL, "messages": QUESTION, "max_tokens": 2},
}


@pytest.mark.parametrize("path", REQUESTS)
def test_document_reuse_false_switches_it_off_in_every_api(reuse_client, path):
    client, engine = reuse_client
    for value, expected in ((False, False), (None, None), (True, None)):  # true: the server's default
        body = {**REQUESTS[path], **({} if value is None else {"document_reuse": value})}
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        assert engine.options[-1].document_reuse is expected
    response = client.post(path, json={**REQUESTS[path], "document_reuse": None})  # null: not given
    assert response.status_code == 200 and engine.options[-1].document_reuse is None


@pytest.mark.parametrize("path", REQUESTS)
@pytest.mark.parametrize("bad", ["no", 0, 1, [], {}])
def test_a_bad_document_reuse_is_a_400_in_the_apis_own_shape(reuse_client, path, bad):
    client, engine = reuse_client
    num_calls = len(engine.options)
    response = client.post(path, json={**REQUESTS[path], "document_reuse": bad})
    assert response.status_code == 400, response.text
    body = response.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert "document_reuse" in body["error"]["message"]
    else:
        assert body["error"]["type"] == "invalid_request_error" and "document_reuse" in body["error"]["param"]
    assert len(engine.options) == num_calls  # nothing reached the engine


def test_usage_breaks_out_the_reused_document_tokens(reuse_client):
    client, engine = reuse_client
    engine.num_cached_tokens, engine.num_reused_document_tokens = 40, 24  # as the engine reports them
    chat = client.post("/v1/chat/completions", json=REQUESTS["/v1/chat/completions"]).json()["usage"]
    assert chat["prompt_tokens_details"] == {"cached_tokens": 40, "reused_document_tokens": 24}
    completion = client.post("/v1/completions", json={**REQUESTS["/v1/completions"],
                                                      "prompt": ["one prompt", "another"]}).json()["usage"]
    assert completion["prompt_tokens_details"] == {"cached_tokens": 80, "reused_document_tokens": 48}
    responses = client.post("/v1/responses", json=REQUESTS["/v1/responses"]).json()["usage"]
    assert responses["input_tokens_details"]["cached_tokens"] == 40
    assert responses["input_tokens_details"]["reused_document_tokens"] == 24
    # Anthropic's usage: document tokens are read from a cache, not processed; no field of their own
    messages = client.post("/v1/messages", json=REQUESTS["/v1/messages"]).json()["usage"]
    assert messages["cache_read_input_tokens"] == 40 and "reused_document_tokens" not in messages
    with client.stream("POST", "/v1/chat/completions",
                       json={**REQUESTS["/v1/chat/completions"], "stream": True,
                             "stream_options": {"include_usage": True}}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert chunks[-1]["usage"]["prompt_tokens_details"]["reused_document_tokens"] == 24


def test_document_reuse_metrics_come_from_the_engine_stats(reuse_client):
    client, engine = reuse_client
    stats = engine.stats()
    documents = DocumentReuseStats(num_reused_spans=3, num_reused_tokens=300, num_recomputed_tokens=48,
                                   num_store_bytes=1 << 20, num_store_entries=5, num_disk_hits=4, num_disk_misses=2,
                                   num_disk_bytes=1 << 21, num_disk_entries=9, num_selective_recomputed_tokens=20)
    engine.stats = lambda: dataclasses.replace(stats, documents=documents)
    text = client.get("/metrics").text
    for sample in ("radixserve:document_reuse_spans_total 3.0", "radixserve:document_reuse_tokens_total 300.0",
                   "radixserve:document_reuse_recomputed_tokens_total 48.0",
                   "radixserve:document_reuse_selective_recomputed_tokens_total 20.0",
                   "radixserve:document_reuse_store_bytes 1.048576e+06", "radixserve:document_reuse_store_entries 5.0",
                   "radixserve:document_reuse_disk_hits_total 4.0", "radixserve:document_reuse_disk_misses_total 2.0",
                   "radixserve:document_reuse_disk_bytes 2.097152e+06", "radixserve:document_reuse_disk_entries 9.0"):
        assert sample in text, sample


def test_adding_documents_precomputes_each_chunk_with_the_ids_a_prompt_gives_it(reuse_client):
    client, engine = reuse_client
    assert client.post("/v1/collections", json={"name": "pre"}).status_code == 201
    response = client.post("/v1/collections/pre/documents", json={"documents": DOCUMENTS})
    assert response.status_code == 200, response.text
    [(token_id_lists, salt)] = engine.precomputed
    assert salt is None and len(token_id_lists) == len(DOCUMENTS)  # one chunk each, short documents
    assert response.json()["num_precomputed_tokens"] == sum(len(ids) for ids in token_id_lists)
    # Each chunk is computed after the context a one-document prompt holds before its text.
    [contexts] = engine.precompute_contexts
    assert len(contexts) == len(DOCUMENTS) and all(contexts)
    # A retrieval prompt's exact spans hold exactly the precomputed ids: they hit the store.
    body = {"messages": QUESTION, "retrieval": {"collection": "pre", "top_k": 3}}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    prompt, spans = engine.prompts[-1], engine.options[-1].document_spans
    assert sorted(prompt[start:end] for start, end in spans) == sorted(token_id_lists)
    # and the chunk's own markup (<document id=... title=...>) ends its context: the same tokens stand
    # right before its span in the retrieval prompt (the stored span's lead matches them)
    for start, end in spans:
        context = contexts[token_id_lists.index(prompt[start:end])]
        num_matching = next((n for n in range(len(context)) if context[-1 - n] != prompt[start - 1 - n]), len(context))
        assert num_matching >= 8, num_matching


def test_precompute_is_skipped_when_asked_or_when_reuse_is_off(make_client, reuse_client):
    client, engine = reuse_client
    client.post("/v1/collections", json={"name": "skip"})
    response = client.post("/v1/collections/skip/documents", json={"documents": DOCUMENTS, "precompute": False})
    assert response.status_code == 200 and response.json()["num_precomputed_tokens"] == 0
    assert "precompute_skipped" not in response.json()  # not asked for: nothing to explain
    assert engine.precomputed == []
    response = client.post("/v1/collections/skip/documents", json={"documents": DOCUMENTS[:1], "cache_salt": "tenant"})
    assert engine.precomputed[-1][1] == "tenant"
    for bad in ({"precompute": "no"}, {"precompute": 1}, {"cache_salt": ""}):
        response = client.post("/v1/collections/skip/documents", json={"documents": DOCUMENTS[:1], **bad})
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    off_client, off_engine = make_client("ok")  # document reuse off: nothing would reuse the KV
    off_client.post("/v1/collections", json={"name": "off"})
    response = off_client.post("/v1/collections/off/documents", json={"documents": DOCUMENTS})
    assert response.status_code == 200 and response.json()["num_precomputed_tokens"] == 0
    assert response.json()["precompute_skipped"] == "document reuse is off on this server"
    assert off_engine.precomputed == []


def test_an_engine_that_cannot_precompute_says_why_and_is_not_asked(reuse_client):
    """As the replicas' handle under a router that cannot reach every replica."""
    client, engine = reuse_client
    engine.precompute_unavailable = "with --replica-router pow2 ... use the prefix router"
    client.post("/v1/collections", json={"name": "unreachable"})
    response = client.post("/v1/collections/unreachable/documents", json={"documents": DOCUMENTS})
    assert response.status_code == 200 and response.json()["num_precomputed_tokens"] == 0
    assert response.json()["precompute_skipped"] == engine.precompute_unavailable
    assert engine.precomputed == []


def test_count_tokens_takes_the_same_body(reuse_client):
    client, _ = reuse_client
    response = client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": QUESTION,
                                                               "document_reuse": False})
    assert response.status_code == 200 and response.json()["input_tokens"] > 0

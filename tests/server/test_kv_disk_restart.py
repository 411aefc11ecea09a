"""A real server stopped and started again serves its cached prefixes from the KV disk tier."""

import re

import httpx
import pytest

from tests.server.conftest import serving

pytestmark = [pytest.mark.model, pytest.mark.slow]

API_KEY = "test-key-123"  # tests/server/conftest.py
PAGE_SIZE = 16
SYSTEM_PROMPT = " ".join(f"Rule {i}: answer briefly and name the rule you follow." for i in range(40))


def _chat(server) -> dict:
    body = {"model": server.model, "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                         {"role": "user", "content": "Which colour is the sky?"}]}
    response = httpx.post(server.api_url + "/chat/completions", json=body, timeout=120,
                          headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 200, response.text
    return response.json()


def _metric(server, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return float(re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE).group(1))


def test_after_a_restart_the_prompt_is_a_disk_hit_with_the_cold_answer(smollm2_dir, tmp_path):
    kv_dir = str(tmp_path / "kv")
    (tmp_path / "first").mkdir(), (tmp_path / "second").mkdir()
    with serving(tmp_path / "first", ["--kv-disk-dir", kv_dir]) as first:
        cold = _chat(first)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    prompt_tokens = cold["usage"]["prompt_tokens"]
    assert prompt_tokens > 20 * PAGE_SIZE

    with serving(tmp_path / "second", ["--kv-disk-dir", kv_dir]) as second:
        tier_lines = [line for line in second.log_lines() if "KV disk tier at" in line]
        assert len(tier_lines) == 1 and kv_dir in tier_lines[0]
        num_pages_held = int(re.search(r"holds (\d+) pages", tier_lines[0]).group(1))
        assert num_pages_held >= prompt_tokens // PAGE_SIZE
        warm = _chat(second)
        assert _metric(second, "radixserve:kv_disk_hits_total") == (prompt_tokens - 1) // PAGE_SIZE * PAGE_SIZE
        assert _metric(second, "radixserve:kv_disk_pages") >= num_pages_held
        assert _metric(second, "radixserve:kv_disk_load_seconds_count") > 0
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == (prompt_tokens - 1) // PAGE_SIZE * PAGE_SIZE
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]


def test_after_a_restart_documents_precomputed_at_ingest_are_reused_from_disk(smollm2_dir, tmp_path):
    """Chunks computed when they were added live on in the tier's documents/; the restarted server's first
    retrieval prompt places them without computing them, as the first server would have."""
    from bench import corpus

    args = ["--kv-disk-dir", str(tmp_path / "kv"), "--collections-dir", str(tmp_path / "collections"),
            "--document-reuse", "on"]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    documents = [{"id": f"doc{i}", "text": text} for i, text in enumerate(corpus.documents(4, 150))]
    question = {"model": "smollm2-135m-instruct", "max_tokens": 2, "temperature": 0,
                "messages": [{"role": "user", "content": "Which module handles queues?"}],
                "retrieval": {"collection": "kb", "top_k": 3}}
    (tmp_path / "first").mkdir(), (tmp_path / "second").mkdir()
    with serving(tmp_path / "first", args) as first:
        assert httpx.post(first.api_url + "/collections", json={"name": "kb"}, headers=headers).status_code == 201
        added = httpx.post(first.api_url + "/collections/kb/documents", json={"documents": documents},
                           headers=headers, timeout=600).json()
        assert added["num_precomputed_tokens"] > 0
        assert _metric(first, "radixserve:document_reuse_disk_hits_total") == 0

    with serving(tmp_path / "second", args) as second:
        disk_lines = [line for line in second.log_lines() if "document KV on disk at" in line]
        assert len(disk_lines) == 1 and int(re.search(r"holds (\d+) spans", disk_lines[0]).group(1)) > 0
        assert _metric(second, "radixserve:document_reuse_store_entries") == 0  # memory starts empty
        response = httpx.post(second.api_url + "/chat/completions", json=question, headers=headers, timeout=600)
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]["prompt_tokens_details"]
        assert usage["reused_document_tokens"] > 200
        # ingest computed each chunk after the prompt's own opening, so the first retrieved chunk can be
        # an exact prefix (its pages from the page tier); the others load from the document files
        assert _metric(second, "radixserve:document_reuse_disk_hits_total") >= 2
        assert _metric(second, "radixserve:document_reuse_disk_bytes") > 0
        assert _metric(second, "radixserve:document_reuse_disk_load_seconds_count") >= 2

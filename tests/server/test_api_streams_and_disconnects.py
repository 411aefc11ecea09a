"""SSE framing, many concurrent streams, and clients that go away (raw httpx)."""

import asyncio
import json

import httpx
import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

API_KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
NUM_STREAMS = 32
MAX_TOKENS = 24


def test_sse_framing_is_openais(server):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.Client(base_url=server.base_url, headers=AUTH, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(event.startswith("data: ") and "\n" not in event for event in events[:-1])
    chunks = [json.loads(event[len("data: "):]) for event in events[:-2]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["delta"] == {} and chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["usage"] is None for c in chunks[:-1])
    assert all(c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-") for c in chunks)


async def _stream(client: httpx.AsyncClient, index: int, cut_after_first: bool) -> dict:
    body = {"messages": [{"role": "user", "content": f"Count from {index} to {index + 30}."}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True}
    content, finish_reason, num_chunks, request_id = "", None, 0, None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            num_chunks += 1
            chunk = json.loads(line[6:])
            request_id = chunk["id"]
            if cut_after_first:
                break  # leaving the block closes the connection
            choice = chunk["choices"][0]
            content += choice["delta"].get("content") or ""
            finish_reason = choice["finish_reason"] or finish_reason
    return {"id": request_id, "content": content, "finish_reason": finish_reason, "num_chunks": num_chunks}


def test_concurrent_streams_half_cut_off(server, wait_until_idle):
    async def main():
        limits = httpx.Limits(max_connections=NUM_STREAMS, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.base_url, headers=AUTH, timeout=120, limits=limits) as client:
            return await asyncio.gather(*(_stream(client, i, cut_after_first=i % 2 == 1)
                                          for i in range(NUM_STREAMS)))

    results = asyncio.run(main())
    for i, result in enumerate(results):
        if i % 2 == 1:
            assert result["num_chunks"] == 1
        else:
            assert result["finish_reason"] == "length" and result["content"], result
    stats = wait_until_idle()
    assert stats["radixserve:num_requests_running"] == 0
    assert stats["radixserve:kv_cache_usage_perc"] == 0
    # The cut streams were aborted, not run to max_tokens.
    cut_ids = {result["id"] for result in results[1::2]}
    cut = [line for line in server.access_log() if line["id"] in cut_ids]
    assert len(cut) == len(cut_ids)
    assert all(not line["complete"] and line["completion_tokens"] < MAX_TOKENS for line in cut), cut


def test_cut_stream_and_cut_non_streamed_request_free_their_pages(server, wait_until_idle):
    long_request = {"messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
                    "max_tokens": 2000, "ignore_eos": True}

    async def main():
        async with httpx.AsyncClient(base_url=server.base_url, headers=AUTH) as client:
            async with client.stream("POST", "/v1/chat/completions", json={**long_request, "stream": True},
                                     timeout=60) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        break
            with pytest.raises(httpx.ReadTimeout):  # the client gives up, closing its connection
                await client.post("/v1/chat/completions", json=long_request, timeout=1.5)

    asyncio.run(main())
    stats = wait_until_idle()
    assert stats["radixserve:num_requests_running"] == 0
    assert stats["radixserve:kv_cache_usage_perc"] == 0
    # Both requests stopped long before 2000 tokens (aborted, not run to the end; the non-streamed one after
    # its client's 1.5 s: a few hundred tokens at the default model's batch-1 decode, ~200 tok/s replayed)
    cut = [line for line in server.access_log() if line["route"] == "/v1/chat/completions"][-2:]
    assert all(line["completion_tokens"] < 1000 for line in cut), cut
    assert {line["status"] for line in cut} == {200, 499}

"""The API through the official `openai` client (sync and async, streamed and not)."""

import asyncio
import json
import time
import uuid

import openai
import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

QUESTION = [{"role": "user", "content": "Name three colors."}]
API_KEY = "test-key-123"


def _unique_messages(text: str = "Name three colors.") -> list[dict]:
    """A prompt no earlier test cached (the system turn differs)."""
    return [{"role": "system", "content": f"Session {uuid.uuid4().hex}."}, {"role": "user", "content": text}]


def test_chat_non_streamed(openai_client, server):
    response = openai_client.chat.completions.create(model=server.model, messages=QUESTION, max_tokens=6,
                                                     temperature=0)
    assert response.id.startswith("chatcmpl-") and response.object == "chat.completion"
    assert response.model == server.model
    choice = response.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_streamed_with_usage(openai_client, server):
    stream = openai_client.chat.completions.create(model=server.model, messages=QUESTION, max_tokens=6,
                                                   temperature=0, stream=True,
                                                   stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    first, finish, usage = chunks[0], chunks[-2], chunks[-1]
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert finish.choices[0].finish_reason in ("stop", "length") and finish.choices[0].delta.content is None
    assert usage.choices == [] and usage.usage.completion_tokens <= 6
    text = "".join(c.choices[0].delta.content or "" for c in chunks[1:-2])
    whole = openai_client.chat.completions.create(model=server.model, messages=QUESTION, max_tokens=6,
                                                  temperature=0)
    assert text == whole.choices[0].message.content  # greedy: streamed and not agree


def test_async_client_streamed_and_not(server):
    async def main():
        async with openai.AsyncOpenAI(base_url=server.api_url, api_key=API_KEY, max_retries=0) as client:
            plain = client.chat.completions.create(model=server.model, messages=QUESTION, max_tokens=4,
                                                   temperature=0)
            streamed = client.chat.completions.create(model=server.model, messages=QUESTION, max_tokens=4,
                                                      temperature=0, stream=True)
            plain, streamed = await asyncio.gather(plain, streamed)
            text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
            return plain.choices[0].message.content, text

    plain_text, streamed_text = asyncio.run(main())
    assert plain_text and plain_text == streamed_text


def test_second_identical_request_hits_the_prefix_cache(openai_client, server):
    messages = _unique_messages("Tell me about the sea in one sentence.")
    first = openai_client.chat.completions.create(model=server.model, messages=messages, max_tokens=2)
    second = openai_client.chat.completions.create(model=server.model, messages=messages, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens - 16
    assert second.usage.prompt_tokens_details.cached_tokens >= second.usage.prompt_tokens - 16


def test_cache_salt_separates_tenants(http, server):
    body = {"model": server.model, "messages": _unique_messages(), "max_tokens": 1, "cache_salt": "tenant-a"}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    other = http.post("/v1/chat/completions", json={**body, "cache_salt": "tenant-b"}).json()
    same = http.post("/v1/chat/completions", json=body).json()
    prompt_tokens = same["usage"]["prompt_tokens"]
    assert same["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt_tokens - 16
    # tenant-b shares only what every prompt shares (nothing of this prompt's own pages)
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] < prompt_tokens - 16


def test_n_choices_share_the_prompt_pages(openai_client, server, scrape):
    before = scrape()["radixserve:prefix_cache_hits_total"]
    response = openai_client.chat.completions.create(model=server.model, messages=_unique_messages(), n=3,
                                                     max_tokens=3, temperature=1.0, seed=11)
    hits = scrape()["radixserve:prefix_cache_hits_total"] - before
    assert sorted(c.index for c in response.choices) == [0, 1, 2]
    prompt_tokens = response.usage.prompt_tokens
    shareable = (prompt_tokens - 1) // 16 * 16  # full pages, one token always recomputed
    assert hits >= 2 * shareable  # choices 1 and 2 reuse choice 0's prompt pages
    assert 3 <= response.usage.completion_tokens <= 9  # summed over the choices


def test_n_choices_streamed(http, server):
    body = {"model": server.model, "messages": QUESTION, "max_tokens": 3, "n": 2, "stream": True, "seed": 3}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["delta"].get("role") == "assistant"]
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(roles) == [0, 1] and sorted(finishes) == [0, 1]


def test_seed_makes_sampling_reproducible(openai_client, server):
    def sample():
        return openai_client.chat.completions.create(model=server.model, messages=QUESTION, max_tokens=6,
                                                     temperature=1.0, seed=1234).choices[0].message.content

    assert sample() == sample()


def test_stop_string_truncates_and_ends_with_stop(openai_client, server):
    greedy = dict(model=server.model, messages=QUESTION, max_tokens=10, temperature=0)
    text = openai_client.chat.completions.create(**greedy).choices[0].message.content
    start = max(1, len(text) // 3)
    stop = text[start:start + 4]
    assert len(stop) == 4
    cut = text.find(stop)
    stopped = openai_client.chat.completions.create(**greedy, stop=[stop, "never-appears"])
    assert stopped.choices[0].message.content == text[:cut]
    assert stopped.choices[0].finish_reason == "stop"


def test_logprobs(openai_client, server):
    response = openai_client.chat.completions.create(model=server.model, messages=QUESTION, max_tokens=3,
                                                     temperature=0, logprobs=True, top_logprobs=2)
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob


def test_text_parts_developer_role_and_tools_are_accepted(openai_client, server):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    response = openai_client.chat.completions.create(
        model=server.model, max_tokens=2, tools=tools,
        messages=[{"role": "developer", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}])
    assert response.choices[0].message.content is not None


def test_completions_string_and_token_ids(openai_client, server):
    response = openai_client.completions.create(model=server.model, prompt="The capital of France is",
                                                max_tokens=4, temperature=0, logprobs=1)
    assert response.object == "text_completion" and response.id.startswith("cmpl-")
    choice = response.choices[0]
    assert choice.text and len(choice.logprobs.tokens) == response.usage.completion_tokens
    token_ids = [504, 3575, 282, 4649, 314]  # any in-vocabulary ids
    by_ids = openai_client.completions.create(model=server.model, prompt=token_ids, max_tokens=2)
    assert by_ids.usage.prompt_tokens == len(token_ids)


def test_completions_streamed(openai_client, server):
    chunks = list(openai_client.completions.create(model=server.model, prompt="Once upon a time", max_tokens=4,
                                                   temperature=0, stream=True,
                                                   stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-2].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks[:-1])


def test_models_health_metrics(openai_client, server, http):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == [server.model]
    assert openai_client.models.retrieve(server.model).id == server.model
    health = http.get("/health", headers={"Authorization": ""}).json()
    assert (health["status"], health["backend"]) == ("ok", "cpu")  # float32 on the CPU: the cpu backend
    assert health["backend_description"].startswith("backend cpu (cpu, float32): linear [")
    assert http.get(f"/v1/models/{server.model}").json()["backend"] == "cpu"
    metrics = http.get("/metrics", headers={"Authorization": ""})
    assert metrics.status_code == 200
    for name in ("time_to_first_token_seconds_bucket", "inter_token_latency_seconds_count",
                 "e2e_request_latency_seconds_sum", "num_requests_running", "num_requests_waiting",
                 "kv_cache_usage_perc", "prefix_cache_queries_total", "prefix_cache_hits_total",
                 "num_requests_prefilling", "num_preemptions_total", "kv_cache_evicted_pages_total",
                 "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total", "spec_decode_mean_acceptance_length"):
        assert f"radixserve:{name}" in metrics.text


def test_access_log_has_one_line_per_request(http, server):
    response = http.post("/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 2})
    request_id = response.json()["id"]
    deadline = time.monotonic() + 5  # the line is written once the response is out
    while not (lines := [line for line in server.access_log() if line["id"] == request_id]):
        assert time.monotonic() < deadline, "no access log line"
        time.sleep(0.05)
    assert len(lines) == 1
    line = lines[0]
    assert line["route"] == "/v1/chat/completions" and line["status"] == 200 and line["complete"]
    assert line["completion_tokens"] == response.json()["usage"]["completion_tokens"]
    assert line["ttft_ms"] > 0 and line["total_ms"] >= line["ttft_ms"]

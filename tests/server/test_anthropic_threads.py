"""Anthropic's message threads, usage and tool-use ids through the official `anthropic` client, on the real
server and model: the SDK's own agent loop (`client.beta.messages.tool_runner`, default thread behaviour) runs
to a final message, each later turn a `continue` that sends only the new messages and reads every earlier
token from the cache."""

import json
import time
import uuid

import httpx
import pytest

from tests.server.conftest import API_KEY, OTHER_API_KEY, PAGE_SIZE

anthropic = pytest.importorskip("anthropic")

pytestmark = [pytest.mark.model, pytest.mark.slow]


def _client(server, key: str = API_KEY, sent: list | None = None):
    hooks = {"request": [lambda request: sent.append(json.loads(request.content or b"{}"))]} if sent is not None else {}
    return anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=0, timeout=120,
                               http_client=anthropic.DefaultHttpxClient(event_hooks=hooks))


def _system() -> str:
    return f"You answer weather questions with the get_weather tool. Session {uuid.uuid4().hex}."


@anthropic.beta_tool
def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: the city
    """
    return f"Sunny, 21 C in {city}."


def test_the_sdk_tool_runner_runs_to_a_final_message_on_a_thread(server):
    sent = []
    with _client(server, sent=sent) as client:
        # The first turn is made to call the tool (a 135M model seldom does by itself), the next ones may answer.
        runner = client.beta.messages.tool_runner(
            model=server.model, max_tokens=60, tools=[get_weather], system=_system(), max_iterations=4,
            tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0},
            messages=[{"role": "user", "content": "Call get_weather for Paris, then tell me the weather."}])
        messages = []
        for message in runner:
            messages.append(message)
            runner.set_messages_params(lambda params: {k: v for k, v in params.items() if k != "tool_choice"})
    first, *later = messages
    assert first.stop_reason == "tool_use" and later, [m.model_dump() for m in messages]
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.id.startswith("toolu_") and use.input == {"city": "Paris"}
    assert messages[-1].stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert len(messages) == 4 or messages[-1].stop_reason != "tool_use"  # it stopped by itself, or at the cap
    assert sent[0]["thread"] == {"type": "create"} and "system" in sent[0]
    for body, previous in zip(sent[1:], messages):
        # only what the server lacks: the tool results; system and tools are the thread's
        assert body["thread"] == {"type": "continue", "previous_message_id": previous.id}
        assert "system" not in body and "tools" not in body
        assert [m["role"] for m in body["messages"]] == ["user"]
        assert body["messages"][0]["content"][0]["type"] == "tool_result"
    # Exact token reuse: each turn reads all of the previous turn's prompt and output but its last partial page.
    for previous, message in zip(messages, later):
        u = previous.usage
        previous_total = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens + u.output_tokens
        assert message.usage.cache_read_input_tokens >= previous_total // PAGE_SIZE * PAGE_SIZE > 0


def test_a_thread_is_the_callers_own_and_a_lost_one_says_so(server):
    with _client(server) as client:
        created = client.beta.messages.create(model=server.model, max_tokens=4, system=_system(),
                                              thread={"type": "create"},
                                              messages=[{"role": "user", "content": "Hi."}])
    continuing = {"model": server.model, "max_tokens": 4, "messages": [{"role": "user", "content": "And?"}],
                  "thread": {"type": "continue", "previous_message_id": created.id}}
    with _client(server, OTHER_API_KEY) as other, pytest.raises(anthropic.NotFoundError) as raised:
        other.beta.messages.create(**continuing)
    assert raised.value.body["error"]["details"] == {"error_code": "thread_not_found"}
    with _client(server) as client:
        with pytest.raises(anthropic.BadRequestError) as raised:
            client.beta.messages.create(**continuing, system="Another system.")
        assert "`system` cannot be sent on a thread `continue`" in raised.value.body["error"]["message"]
        with client.beta.messages.stream(**continuing) as stream:  # a streamed continue is stored as well
            streamed = stream.get_final_message()
        again = client.beta.messages.create(**{**continuing, "thread": {"type": "continue",
                                                                       "previous_message_id": streamed.id}})
    assert again.usage.cache_read_input_tokens > 0


def test_reads_of_a_cached_breakpoint_create_nothing(server):
    # the session id first: no page of this prompt is in the cache before the first request
    long_system = f"Session {uuid.uuid4().hex}. " + " ".join(f"Rule {i}: answer in one short sentence." for i in range(40))
    system = [{"type": "text", "text": long_system, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    usages = []
    with _client(server) as client:
        for question in ("What is two plus two?", "Name a large city.", "Name a colour."):
            # without the document store, whose spans of other tests' rules would be read too
            usages.append(client.messages.create(model=server.model, max_tokens=2, system=system,
                                                 extra_body={"document_reuse": False},
                                                 messages=[{"role": "user", "content": question}]).usage)
    first, *reads = usages
    num_breakpoint_tokens = first.cache_creation_input_tokens
    assert num_breakpoint_tokens > PAGE_SIZE and first.cache_read_input_tokens == 0
    assert first.cache_creation.ephemeral_1h_input_tokens == num_breakpoint_tokens
    assert first.cache_creation.ephemeral_5m_input_tokens == 0
    for usage in reads:  # the whole breakpoint prefix, read (and what the tree holds after it): none created again
        assert usage.cache_creation_input_tokens == 0
        assert num_breakpoint_tokens <= usage.cache_read_input_tokens < num_breakpoint_tokens + PAGE_SIZE
        assert usage.cache_creation.ephemeral_1h_input_tokens == usage.cache_creation.ephemeral_5m_input_tokens == 0


def test_streamed_usage_carries_the_cache_creation_breakdown(server):
    body = {"model": server.model, "max_tokens": 2, "stream": True, "system": _system(),
            "messages": [{"role": "user", "content": "Hello"}]}
    with httpx.stream("POST", server.base_url + "/v1/messages", json=body, headers={"x-api-key": API_KEY},
                      timeout=120) as response:
        datas = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines() if line.startswith("data: ")]
    start = datas[0]["message"]["usage"]
    assert start["cache_creation"] == {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}


def test_a_reply_is_continued_once_as_anthropic_answers_a_fork(server):
    """A second `continue` from the same reply is Anthropic's 400 "thread_already_continued"; one sent while
    another continuation of it runs is "thread_continue_in_flight"; a continuation the client left before its
    reply was stored leaves the reply free again. The SDK replays the whole history on each of these codes."""
    with _client(server) as client:
        created = client.beta.messages.create(model=server.model, max_tokens=4, system=_system(),
                                              thread={"type": "create"},
                                              messages=[{"role": "user", "content": "Hi."}])

        def continuing(max_tokens: int = 4, question: str = "And?") -> dict:
            return {"model": server.model, "max_tokens": max_tokens, "extra_body": {"temperature": 0},
                    "messages": [{"role": "user", "content": question}],
                    "thread": {"type": "continue", "previous_message_id": created.id}}

        # in flight: a long streamed continuation holds the reply until its own reply is stored
        with client.beta.messages.stream(**continuing(400, "Count from 1 to 300, one number a line.")) as stream:
            next(iter(stream))  # message_start: the continuation runs
            with pytest.raises(anthropic.BadRequestError) as raised:
                client.beta.messages.create(**continuing())
        assert raised.value.body["error"]["details"] == {"error_code": "thread_continue_in_flight"}
        assert raised.value.body["error"]["type"] == "invalid_request_error"
        # the stream was left before its reply was stored: the reply can be continued (once the server saw it go)
        for _ in range(100):
            try:
                first = client.beta.messages.create(**continuing())
                break
            except anthropic.BadRequestError as error:
                assert error.body["error"]["details"] == {"error_code": "thread_continue_in_flight"}
                time.sleep(0.1)
        assert first.usage.cache_read_input_tokens > 0
        with pytest.raises(anthropic.BadRequestError) as raised:  # a fork
            client.beta.messages.create(**continuing(question="Or?"))
    assert raised.value.body["error"]["details"] == {"error_code": "thread_already_continued"}
    assert type(raised.value).__name__ == "ThreadAlreadyContinuedError"  # the SDK's class for this code
    assert created.id in raised.value.body["error"]["message"]

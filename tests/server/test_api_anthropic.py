"""Anthropic's Messages API through the official `anthropic` client, on the real server and model."""

import json
import uuid

import httpx
import pytest

from tests.server.conftest import API_KEY, PAGE_SIZE

anthropic = pytest.importorskip("anthropic")

pytestmark = [pytest.mark.model, pytest.mark.slow]

WEATHER_TOOL = {"name": "get_weather", "description": "Current weather in a city.",
                "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo", "Lima"]}},
                                 "required": ["city"], "additionalProperties": False}}


@pytest.fixture
def client(server):
    with anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=120) as client:
        yield client


def _system() -> str:
    return f"You are a terse assistant. Session {uuid.uuid4().hex}."


def _total_input(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_a_message_and_its_usage(client, server):
    message = client.messages.create(model=server.model, max_tokens=12, system=_system(),
                                     messages=[{"role": "user", "content": "Name a colour."}])
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.stop_reason in ("end_turn", "max_tokens")
    [block] = message.content
    assert block.type == "text" and block.text
    assert 0 < message.usage.output_tokens <= 12
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 0


def test_count_tokens_is_the_prompt_a_message_pays_for(client, server):
    request = dict(model=server.model, system=_system(), messages=[{"role": "user", "content": "Hi there."}])
    counted = client.messages.count_tokens(**request).input_tokens
    message = client.messages.create(**request, max_tokens=2)
    assert counted == _total_input(message.usage) > 0


def test_stream_sends_the_event_sequence_and_reassembles_to_the_message(client, server):
    request = dict(model=server.model, max_tokens=16, extra_body={"temperature": 0}, system=_system(),
                   messages=[{"role": "user", "content": "Count from one to five."}])
    whole = client.messages.create(**request)
    events = []
    with client.messages.stream(**request) as stream:
        for event in stream:
            events.append(event.type)
        final = stream.get_final_message()
    raw = [e for e in events if e in ("message_start", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop")]
    assert raw[0] == "message_start" and raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_raw_stream_has_a_ping_and_anthropic_framing(server):
    body = {"model": server.model, "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": "Hello"}]}
    with httpx.stream("POST", server.base_url + "/v1/messages", json=body, headers={"x-api-key": API_KEY},
                      timeout=120) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    types = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert types[:2] == ["message_start", "ping"] and types[-1] == "message_stop"
    datas = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in datas] == types
    delta = next(d for d in datas if d["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens") and delta["usage"]["output_tokens"] >= 1


def test_stop_sequence_is_reported(client, server):
    message = client.messages.create(model=server.model, max_tokens=40, extra_body={"temperature": 0}, system=_system(),
                                     stop_sequences=["3"],
                                     messages=[{"role": "user", "content": "Count: 1, 2, 3, 4, 5. Repeat it."}])
    if message.stop_reason == "stop_sequence":
        assert message.stop_sequence == "3" and "3" not in message.content[0].text
    else:  # the model may not write a 3; then nothing claims it did
        assert message.stop_sequence is None


def test_five_turn_tool_loop_reuses_the_cache_every_turn(client, server):
    messages = [{"role": "user", "content": "What is the weather in Paris, then Rome, Oslo, Lima and Kyiv?"}]
    request = dict(model=server.model, max_tokens=40, system=_system(), tools=[WEATHER_TOOL],
                   tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    previous_total = None
    for turn in range(5):
        message = client.messages.create(**request, messages=messages)
        assert message.stop_reason == "tool_use"
        [use] = [b for b in message.content if b.type == "tool_use"]
        assert use.name == "get_weather" and use.input["city"] in ("Paris", "Rome", "Oslo", "Lima")
        if previous_total is not None:
            assert message.usage.cache_read_input_tokens >= previous_total - PAGE_SIZE
        previous_total = _total_input(message.usage) + message.usage.output_tokens
        messages = messages + [message.to_param(),
                               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                             "content": f"Sunny, {20 + turn} C."}]}]


def test_a_cache_control_breakpoint_is_read_back_on_its_second_use(client, server):
    long_system = _system() + " " + " ".join(f"Rule {i}: answer in one short sentence." for i in range(40))
    system = [{"type": "text", "text": long_system, "cache_control": {"type": "ephemeral", "ttl": "5m"}}]
    first = client.messages.create(model=server.model, max_tokens=4, system=system,
                                   messages=[{"role": "user", "content": "What is two plus two?"}])
    num_breakpoint_tokens = first.usage.cache_creation_input_tokens + first.usage.cache_read_input_tokens
    assert first.usage.cache_creation_input_tokens > 0
    second = client.messages.create(model=server.model, max_tokens=4, system=system,
                                    messages=[{"role": "user", "content": "Name a large city."}])
    assert second.usage.cache_read_input_tokens >= num_breakpoint_tokens // PAGE_SIZE * PAGE_SIZE > 0
    assert second.usage.cache_creation_input_tokens < PAGE_SIZE  # the prefix was there: nothing new to write


def test_diagnostics_name_where_the_prompt_diverged(client, server):
    system = _system()
    first = client.messages.create(model=server.model, max_tokens=2, system=system,
                                   messages=[{"role": "user", "content": "Tell me about apples."}],
                                   diagnostics={"previous_message_id": None})
    assert first.diagnostics is not None and first.diagnostics.cache_miss_reason is None
    changed = client.messages.create(model=server.model, max_tokens=2, system=system,
                                     messages=[{"role": "user", "content": "Tell me about pears."}],
                                     diagnostics={"previous_message_id": first.id})
    reason = changed.diagnostics.cache_miss_reason
    assert reason.type == "messages_changed" and reason.cache_missed_input_tokens > 0
    extra = reason.model_dump()
    assert extra["first_differing_block"] == "messages[0]" and extra["first_differing_token"] > 0
    missing = client.messages.create(model=server.model, max_tokens=2, system=system,
                                     messages=[{"role": "user", "content": "Hi"}],
                                     diagnostics={"previous_message_id": "msg_doesnotexist"})
    assert missing.diagnostics.cache_miss_reason.type == "previous_message_not_found"


@pytest.mark.parametrize("body, status, fragment", [
    ({"messages": [{"role": "user", "content": "Hi"}]}, 400, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "frobnicate": 1}, 400, "frobnicate"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400, "image"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "temperature": 1.5}, 400, "temperature"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}],
      "thinking": {"type": "enabled", "budget_tokens": 1024}}, 400, "thinking"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "container": "c1"}, 400, "container"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}],
      "tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER_TOOL]}, 400, "nope"),
    ({"max_tokens": 5, "messages": []}, 400, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": str(i), "cache_control": {"type": "ephemeral"}} for i in range(5)]}]}, 400, "maximum"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "model": "claude-nope"}, 404, "claude-nope"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}], "tools": True}, 400, "tools"),  # was a 500
])
def test_bad_requests_get_anthropic_errors(server, body, status, fragment):
    body = {"model": server.model, **body}
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        if route.endswith("count_tokens") and fragment in ("max_tokens", "temperature"):
            continue  # count_tokens takes neither field
        if route.endswith("count_tokens"):
            body = {k: v for k, v in body.items() if k != "max_tokens"}
        response = httpx.post(server.base_url + route, json=body, headers={"x-api-key": API_KEY}, timeout=60)
        assert response.status_code == status, response.text
        error = response.json()
        assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
        assert error["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
        assert fragment in error["error"]["message"]


def test_malformed_json_and_a_wrong_key_get_anthropic_errors(server):
    response = httpx.post(server.base_url + "/v1/messages", content=b"{not json", timeout=30,
                          headers={"x-api-key": API_KEY, "content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    with anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0) as client:
        with pytest.raises(anthropic.AuthenticationError) as raised:
            client.messages.create(model=server.model, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.status_code == 401 and raised.value.body["error"]["type"] == "authentication_error"


def test_a_bearer_token_works_as_well(server):
    response = httpx.post(server.base_url + "/v1/messages", timeout=60,
                          headers={"Authorization": f"Bearer {API_KEY}"},
                          json={"model": server.model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert response.status_code == 200 and response.json()["type"] == "message"


def test_a_streamed_tool_use_reassembles_to_the_message(client, server):
    request = dict(model=server.model, max_tokens=40, system=_system(), tools=[WEATHER_TOOL],
                   tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0},
                   messages=[{"role": "user", "content": "Weather in Oslo?"}])
    whole = client.messages.create(**request)
    kinds = []
    with client.messages.stream(**request) as stream:
        for event in stream:
            if event.type == "content_block_start":
                kinds.append(event.content_block.type)
            elif event.type == "content_block_delta":
                kinds.append(event.delta.type)
        final = stream.get_final_message()
    assert kinds[0] == "tool_use" and set(kinds[1:]) == {"input_json_delta"}
    assert final.stop_reason == whole.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in final.content] == [(b.type, b.name, b.input) for b in whole.content]


@pytest.mark.parametrize("method, route, kwargs, status", [
    ("GET", "/v1/messages", {}, 405),
    ("POST", "/v1/messages", {"content": b"x" * 1_100_000}, 413),
    ("POST", "/v1/messages", {"json": [1, 2]}, 400),
    ("POST", "/v1/messages/count_tokens", {"json": {"model": "m"}}, 400),
])
def test_framework_errors_on_the_messages_routes_are_anthropic_shaped(server, method, route, kwargs, status):
    response = httpx.request(method, server.base_url + route, headers={"x-api-key": API_KEY}, timeout=60, **kwargs)
    assert response.status_code == status, response.text
    assert response.json()["type"] == "error" and "message" in response.json()["error"]

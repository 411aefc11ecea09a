"""OpenAI's Responses API through the official `openai` client, on the real server and model."""

import json
import uuid

import httpx
import openai
import pytest

from tests.server.conftest import OTHER_API_KEY, PAGE_SIZE

pytestmark = [pytest.mark.model, pytest.mark.slow]

CITIES = ["Paris", "Rome", "Oslo", "Lima"]
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"enum": CITIES}},
                               "required": ["city"], "additionalProperties": False}, "strict": True}


def _instructions() -> str:
    return f"You are a weather assistant. Session {uuid.uuid4().hex}."


@pytest.fixture
def other_client(server):
    with openai.OpenAI(base_url=server.api_url, api_key=OTHER_API_KEY, max_retries=0, timeout=120) as client:
        yield client


def test_a_response_and_its_usage(openai_client, server):
    response = openai_client.responses.create(model=server.model, instructions=_instructions(),
                                              input="Say hello.", max_output_tokens=8)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete") and response.output_text
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 8
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens <= usage.input_tokens
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"


def test_five_function_call_turns_chained_by_previous_response_id_pay_only_for_new_input(openai_client, server):
    request = dict(model=server.model, instructions=_instructions(), tools=[WEATHER_TOOL], tool_choice="required",
                   parallel_tool_calls=False, max_output_tokens=30, temperature=0)
    response = openai_client.responses.create(**request, input="Weather in Paris, Rome, Oslo and Lima, one by one.")
    for turn in range(5):
        [call] = [item for item in response.output if item.type == "function_call"]
        assert call.name == "get_weather" and json.loads(call.arguments)["city"] in CITIES
        previous = response
        response = openai_client.responses.create(
            **request, previous_response_id=previous.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": f"Sunny, {20 + turn} C"}])
        cached = response.usage.input_tokens_details.cached_tokens
        assert cached >= previous.usage.input_tokens + previous.usage.output_tokens - PAGE_SIZE
        assert response.previous_response_id == previous.id


def _reassembled(events) -> tuple[list[dict], dict]:
    """Output items rebuilt from the deltas alone, and the final response object."""
    items: dict[int, dict] = {}
    final = None
    numbers = []
    for event in events:
        numbers.append(event.sequence_number)
        if event.type == "response.output_item.added":
            item = event.item
            items[event.output_index] = ({"type": "message", "text": ""} if item.type == "message" else
                                         {"type": "function_call", "name": item.name, "arguments": ""})
        elif event.type == "response.output_text.delta":
            items[event.output_index]["text"] += event.delta
        elif event.type == "response.function_call_arguments.delta":
            items[event.output_index]["arguments"] += event.delta
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert numbers == list(range(len(numbers)))
    return [items[i] for i in sorted(items)], final


def _items(response) -> list[dict]:
    return [{"type": "message", "text": item.content[0].text} if item.type == "message" else
            {"type": "function_call", "name": item.name, "arguments": item.arguments} for item in response.output]


@pytest.mark.parametrize("tool_choice", ["none", "required"])
def test_streamed_events_reassemble_to_the_non_streamed_response(openai_client, server, tool_choice):
    request = dict(model=server.model, instructions=_instructions(), input="What is the weather in Oslo?",
                   tools=[WEATHER_TOOL], tool_choice=tool_choice, max_output_tokens=60, temperature=0)
    whole = openai_client.responses.create(**request)
    events = list(openai_client.responses.create(**request, stream=True))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    rebuilt, final = _reassembled(events)
    assert rebuilt == _items(final) == _items(whole)
    assert final.status == whole.status and final.usage.output_tokens == whole.usage.output_tokens
    assert openai_client.responses.retrieve(final.id).output_text == final.output_text


def test_a_call_cut_by_max_output_tokens_is_no_call(openai_client, server):
    """Its argument deltas were streamed (they cannot be taken back), but the response, streamed
    or not, has no function_call: the arguments never ended (issue 12)."""
    request = dict(model=server.model, instructions=_instructions(), input="What is the weather in Oslo?",
                   tools=[WEATHER_TOOL], tool_choice="required", max_output_tokens=20, temperature=0)
    whole = openai_client.responses.create(**request)
    rebuilt, final = _reassembled(list(openai_client.responses.create(**request, stream=True)))
    assert [item["type"] for item in rebuilt] == ["function_call"]
    assert _items(final) == _items(whole) and not any(item.type == "function_call" for item in whole.output)
    assert whole.status == final.status == "incomplete"


def test_stored_responses_are_visible_only_to_their_key(openai_client, other_client, server):
    response = openai_client.responses.create(model=server.model, input="Hi", max_output_tokens=4)
    assert openai_client.responses.retrieve(response.id).model_dump() == response.model_dump()
    with pytest.raises(openai.NotFoundError):
        other_client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as raised:
        other_client.responses.create(model=server.model, input="Go on", max_output_tokens=4,
                                      previous_response_id=response.id)
    assert raised.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        other_client.responses.delete(response.id)
    openai_client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(response.id)


def test_store_false_keeps_nothing(openai_client, server):
    response = openai_client.responses.create(model=server.model, input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(response.id)


def test_prompt_cache_diagnostics_compare_with_an_earlier_response(openai_client, server):
    instructions = _instructions()
    first = openai_client.responses.create(model=server.model, instructions=instructions, input="Tell me about apples.",
                                           max_output_tokens=2)
    changed = openai_client.responses.create(model=server.model, instructions=instructions,
                                             input="Tell me about pears.", max_output_tokens=2,
                                             prompt_cache_options={"comparison_response_id": first.id})
    diagnostics = changed.prompt_cache_diagnostics
    assert diagnostics.type == "cache_miss" and diagnostics.reason == "input_changed"
    assert diagnostics.cache_missed_tokens > 0 and diagnostics.comparison_reusable_tokens > 0
    assert diagnostics.model_dump()["first_differing_block"] == "input[0]"
    keyed = openai_client.responses.create(model=server.model, instructions=instructions, input="Tell me about pears.",
                                           max_output_tokens=2, prompt_cache_key="other-scope",
                                           prompt_cache_options={"comparison_response_id": first.id})
    assert keyed.prompt_cache_diagnostics.reason == "prompt_cache_key_changed"
    continued = openai_client.responses.create(model=server.model, instructions=instructions, input="And plums?",
                                               previous_response_id=first.id, max_output_tokens=2,
                                               prompt_cache_options={"comparison_response_id": first.id})
    assert continued.prompt_cache_diagnostics.type == "cache_hit"
    missing = openai_client.responses.create(model=server.model, input="Hi", max_output_tokens=2,
                                             prompt_cache_options={"comparison_response_id": "resp_nope"})
    assert missing.prompt_cache_diagnostics.type == "comparison_response_not_found"


def test_a_prompt_cache_breakpoint_pins_its_prefix(openai_client, server):
    instructions = _instructions() + " " + " ".join(f"Rule {i}: be brief." for i in range(30))
    part = {"type": "input_text", "text": instructions, "prompt_cache_breakpoint": {"mode": "explicit"}}
    first = openai_client.responses.create(model=server.model, max_output_tokens=2,
                                           input=[{"role": "developer", "content": [part]},
                                                  {"role": "user", "content": "Hi"}])
    assert first.usage.input_tokens_details.cache_write_tokens > PAGE_SIZE
    second = openai_client.responses.create(model=server.model, max_output_tokens=2,
                                            input=[{"role": "developer", "content": [part]},
                                                   {"role": "user", "content": "Hello"}])
    written = first.usage.input_tokens_details.cache_write_tokens + first.usage.input_tokens_details.cached_tokens
    assert second.usage.input_tokens_details.cached_tokens >= written // PAGE_SIZE * PAGE_SIZE


@pytest.mark.parametrize("body, status, param_or_fragment", [
    ({"input": "Hi", "frobnicate": 1}, 400, "frobnicate"),
    ({"input": [{"type": "reasoning", "summary": []}]}, 400, "reasoning"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, 400, "web_search"),
    ({"input": "Hi", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}}, 400, "nope"),
    ({"input": []}, 400, "empty"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema"}}}, 400, "json_schema"),
    ({"input": "Hi", "background": True}, 400, "background"),
    ({"input": "Hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400, "input_image"),
    ({"input": "Hi", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
    ({"input": "Hi", "model": "gpt-nope"}, 404, "model"),
])
def test_bad_requests_get_openai_errors(http, body, status, param_or_fragment):
    response = http.post("/v1/responses", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert param_or_fragment in error["message"] or error["param"] == param_or_fragment


def test_a_wrong_key_and_an_unknown_id(server, http):
    response = httpx.get(server.api_url + "/responses/resp_x", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    assert http.get("/v1/responses/resp_x").status_code == 404
    assert http.delete("/v1/responses/resp_x").json()["error"]["code"] == "response_not_found"

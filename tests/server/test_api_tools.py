"""Tool calling, JSON output, documents and multi-turn cache reuse through the `openai` client, on the real model."""

import json
import uuid

import pytest

from assembly.chat_template import ChatTemplate
from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import SegmentTokenizer
from assembly.tokenizer import Tokenizer

pytestmark = [pytest.mark.model, pytest.mark.slow]

PAGE_SIZE = 16
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"},
                                                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                      "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                      "parameters": WEATHER_PARAMETERS}},
    {"type": "function", "function": {"name": "search_web", "description": "Search the web.",
                                      "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                     "required": ["query"]}}},
]
WEATHER_CHOICE = {"type": "function", "function": {"name": "get_weather"}}


def _session(question: str = "What is the weather like in Paris today?") -> list[dict]:
    return [{"role": "system", "content": f"You are a travel agent. Session {uuid.uuid4().hex}."},
            {"role": "user", "content": question}]


def _fits_weather_schema(arguments: dict) -> bool:
    return (set(arguments) == {"city", "unit"} and isinstance(arguments["city"], str)
            and arguments["unit"] in ("celsius", "fahrenheit"))


def test_named_tool_choice_returns_a_schema_valid_call(openai_client, server):
    response = openai_client.chat.completions.create(model=server.model, messages=_session(), tools=TOOLS,
                                                     tool_choice=WEATHER_CHOICE, max_tokens=60, temperature=0.7,
                                                     seed=3)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert _fits_weather_schema(json.loads(call.function.arguments))


def test_pydantic_parameters_with_defs_give_calls_that_validate(openai_client, server):
    """Parameters from pydantic's model_json_schema() ($defs + $ref), forced by name and by required:
    the real model's arguments are complete JSON that the pydantic model accepts."""
    from pydantic import BaseModel

    class Address(BaseModel):
        city: str
        country: str

    class Booking(BaseModel):
        guest: str
        address: Address
        nights: int

    tools = [{"type": "function", "function": {"name": "book_hotel", "description": "Book a hotel room.",
                                               "parameters": Booking.model_json_schema()}}]
    for tool_choice in ({"type": "function", "function": {"name": "book_hotel"}}, "required"):
        response = openai_client.chat.completions.create(
            model=server.model, messages=_session("Book me two nights in Paris, I am Ann."), tools=tools,
            tool_choice=tool_choice, max_tokens=200, temperature=0)
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.tool_calls
        for call in choice.message.tool_calls:  # "required" allows parallel calls
            assert call.function.name == "book_hotel"
            Booking.model_validate_json(call.function.arguments)


def test_streamed_tool_call_deltas_reassemble_to_the_non_streamed_call(openai_client, server):
    messages = _session("Check the weather in Lisbon, please.")
    request = dict(model=server.model, messages=messages, tools=TOOLS, tool_choice=WEATHER_CHOICE, max_tokens=60,
                   temperature=0)
    whole = openai_client.chat.completions.create(**request).choices[0]
    calls: dict[int, dict] = {}
    finish_reason = None
    for chunk in openai_client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            finish_reason = choice.finish_reason or finish_reason
            assert not choice.delta.content
            for delta in choice.delta.tool_calls or ():
                if delta.id is not None:  # a call's first delta: index, id and name
                    assert delta.function.name and delta.index not in calls
                    calls[delta.index] = {"name": delta.function.name, "arguments": delta.function.arguments or ""}
                else:
                    assert delta.function.name is None
                    calls[delta.index]["arguments"] += delta.function.arguments
    assert finish_reason == whole.finish_reason == "tool_calls"
    assert [calls[i] for i in sorted(calls)] == [{"name": c.function.name, "arguments": c.function.arguments}
                                                  for c in whole.message.tool_calls]


def test_five_turn_agent_loop_hits_the_cache_for_each_previous_turn(openai_client, server):
    messages = _session("Plan a trip: check the weather in Rome, then in Milan, then in Turin.")
    previous_total = None
    for turn in range(5):
        response = openai_client.chat.completions.create(model=server.model, messages=messages, tools=TOOLS,
                                                         tool_choice="required", parallel_tool_calls=False,
                                                         max_tokens=60, temperature=0)
        usage, message = response.usage, response.choices[0].message
        if previous_total is not None:
            assert usage.prompt_tokens_details.cached_tokens >= previous_total - 20, (turn, usage)
        previous_total = usage.prompt_tokens + usage.completion_tokens
        assert response.choices[0].finish_reason == "tool_calls"
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": json.dumps({"temperature": 20 + turn, "sky": "clear"})})


def test_auto_tool_choice_answers_with_text_or_well_formed_calls(openai_client, server):
    response = openai_client.chat.completions.create(model=server.model, messages=_session(), tools=TOOLS,
                                                     max_tokens=40, temperature=0)
    choice = response.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        for call in choice.message.tool_calls:
            json.loads(call.function.arguments)
    else:
        assert choice.message.content and choice.finish_reason in ("stop", "length")


def test_json_schema_response_format(openai_client, server):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    response = openai_client.chat.completions.create(
        model=server.model, messages=_session("Invent a person: a name and an age."), max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert response.choices[0].finish_reason == "stop"
    value = json.loads(response.choices[0].message.content)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int) and len(value["name"]) <= 24
    response = openai_client.chat.completions.create(
        model=server.model, messages=_session('Reply with the JSON object {"ok": true}.'), max_tokens=60,
        temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(response.choices[0].message.content), dict)


DOCUMENTS = [
    {"id": "freedonia", "title": "Freedonia", "text": "Freedonia's capital is Blorptown, founded in 1821 " * 6},
    {"id": "sylvania", "title": "Sylvania", "text": "Sylvania exports marmalade and violins. " * 8},
]


def test_documents_are_in_the_prompt_and_share_pages_across_questions(openai_client, server, smollm2_dir):
    system = {"role": "system", "content": f"Answer from the documents. Run {uuid.uuid4().hex}."}
    questions = ["What is the capital of Freedonia?", "What does Sylvania export?"]
    responses = [openai_client.chat.completions.create(model=server.model, max_tokens=12, temperature=0,
                                                       messages=[system, {"role": "user", "content": q}],
                                                       extra_body={"documents": DOCUMENTS})
                 for q in questions]
    assert "Blorptown" in responses[0].choices[0].message.content
    # Tokens both prompts share (system, documents) come from the cache for the second question.
    builder = PromptBuilder(SegmentTokenizer(Tokenizer(smollm2_dir)), ChatTemplate.from_model_dir(smollm2_dir))
    prompts = [builder.build([system, {"role": "user", "content": q}], documents=DOCUMENTS) for q in questions]
    assert [r.usage.prompt_tokens for r in responses] == [len(p) for p in prompts]
    num_shared = next(i for i, (a, b) in enumerate(zip(*prompts)) if a != b)
    assert num_shared > 150
    assert responses[1].usage.prompt_tokens_details.cached_tokens >= num_shared // PAGE_SIZE * PAGE_SIZE

"""Tool turns out of order are 400s in every API that takes turns, worded as OpenAI and Anthropic word
them, through the official clients: a tool turn without its call id, a result for no earlier call, calls
left without their results (server/tool_turns.py). In-process with the scripted fake engine (nothing is
generated), except Anthropic's client, whose HTTP stack is not the test client's: the real server there."""

import openai
import pytest

from server.tool_turns import find_tool_turn_problem
from tests.server.conftest import API_KEY, MODEL

CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
CALL_2 = {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


@pytest.fixture
def api(make_client):
    client, engine = make_client()
    # not closed: the TestClient (its http_client) is closed by the fixture
    return openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key="unused", http_client=client, max_retries=0)


def test_the_problems_found_in_openai_shaped_turns():
    user, assistant = {"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "r"}
    assert find_tool_turn_problem([user, assistant, result, {"role": "assistant", "content": "a"}]) is None
    assert find_tool_turn_problem([user, assistant]) is None  # calls that end the conversation: not run yet
    assert find_tool_turn_problem([user, {"role": "tool", "content": "r"}]).kind == "missing_call_id"
    assert find_tool_turn_problem([user, result]).kind == "no_call_before"
    wrong = find_tool_turn_problem([user, assistant, {**result, "tool_call_id": "call_9"}])
    assert (wrong.kind, wrong.message_index, wrong.call_ids) == ("unknown_call_id", 2, ("call_9",))
    two = {**assistant, "tool_calls": [CALL, CALL_2]}
    unanswered = find_tool_turn_problem([user, two, result, user])
    assert (unanswered.kind, unanswered.message_index, unanswered.call_ids) == ("unanswered_calls", 1, ("call_2",))


@pytest.mark.parametrize("messages, param, fragment", [
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "content": "r"}], "messages[2].tool_call_id",
     "Missing required parameter: 'messages[2].tool_call_id'."),
    ([{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "call_1", "content": "r"}],
     "messages[1].role", "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_9", "content": "r"}], "messages[2].tool_call_id",
     "'tool_call_id' of 'call_9' not found in 'tool_calls' of previous message"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [CALL, CALL_2]},
      {"role": "tool", "tool_call_id": "call_1", "content": "r"}, {"role": "user", "content": "and?"}],
     "messages[1].role", "The following tool_call_ids did not have response messages: call_2"),
])
def test_chat_completions_refuse_tool_turns_out_of_order(api, messages, param, fragment):
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=4)
    error = raised.value.body
    assert raised.value.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param and fragment in error["message"]


@pytest.mark.parametrize("items, fragment", [
    ([{"role": "user", "content": "q"}, {"type": "function_call_output", "call_id": "call_1", "output": "r"}],
     "No tool call found for function call output with call_id call_1."),
    ([{"role": "user", "content": "q"}, {"type": "function_call", "call_id": "call_1", "name": "lookup",
                                        "arguments": "{}"},
      {"type": "function_call", "call_id": "call_2", "name": "lookup", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "r"}, {"role": "user", "content": "and?"}],
     "No tool output found for function call call_2."),
])
def test_responses_refuse_outputs_without_calls_and_calls_without_outputs(api, items, fragment):
    with pytest.raises(openai.BadRequestError) as raised:
        api.responses.create(model=MODEL, input=items, store=False, max_output_tokens=4,
                             tools=[{"type": "function", "name": "lookup", "parameters": {"type": "object"}}])
    assert raised.value.body["param"] == "input" and raised.value.body["message"] == fragment


@pytest.mark.model
def test_anthropic_messages_refuse_tool_results_out_of_order(server):
    anthropic = pytest.importorskip("anthropic")
    use = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}
    use_2 = {**use, "id": "toolu_2"}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}
    cases = [
        ([{"role": "user", "content": [{"type": "text", "text": "q"}, {**result, "tool_use_id": "toolu_9"}]}],
         "messages.0.content.1: unexpected `tool_use_id` found in `tool_result` blocks: toolu_9. Each `tool_result` "
         "block must have a corresponding `tool_use` block in the previous message."),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": [use, use_2]},
          {"role": "user", "content": [result, {"type": "text", "text": "and?"}]}],
         "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_2. Each "
         "`tool_use` block must have a corresponding `tool_result` block in the next message."),
    ]
    tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
    with anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=60) as client:
        for messages, message in cases:
            with pytest.raises(anthropic.BadRequestError) as raised:
                client.messages.create(model=server.model, max_tokens=4, tools=tools, messages=messages)
            assert raised.value.body["error"] == {"type": "invalid_request_error", "message": message}
            with pytest.raises(anthropic.BadRequestError):  # counting a prompt checks it too
                client.messages.count_tokens(model=server.model, tools=tools, messages=messages)


def test_vllm_continuous_usage_stats_put_the_usage_on_every_chunk(api):
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=8, stream=True, stream_options=options))
    assert all(chunk.usage is not None for chunk in chunks)
    completions = [chunk.usage.completion_tokens for chunk in chunks]
    assert completions == sorted(completions) and completions[-1] == chunks[-1].usage.completion_tokens > 0
    assert all(chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens
               for chunk in chunks)
    texts = list(api.completions.create(model=MODEL, prompt="Hi", max_tokens=8, stream=True, stream_options=options))
    assert all(chunk.usage is not None and chunk.usage.prompt_tokens > 0 for chunk in texts)
    plain = list(api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                             max_tokens=8, stream=True, stream_options={"include_usage": True}))
    assert [chunk.usage is not None for chunk in plain] == [False] * (len(plain) - 1) + [True]

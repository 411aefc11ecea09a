"""The speculation extension field on every API, and outputs of several tokens (what a speculating
engine yields) through stop strings, streaming, logprobs and tool calls. Fake engine, in-process."""

import json

import pytest

PROMPT = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/chat/completions": {"messages": PROMPT},
    "/v1/completions": {"prompt": "hi"},
    "/v1/responses": {"input": "hi"},
    "/v1/messages": {"model": "fake-model", "max_tokens": 8, "messages": PROMPT},
}


@pytest.mark.parametrize("path", list(BODIES))
def test_speculation_false_reaches_the_engine_and_absent_means_the_default(make_client, path):
    client, engine = make_client()
    assert client.post(path, json={**BODIES[path], "speculation": False}).status_code == 200
    assert engine.options[-1].speculation is False
    assert client.post(path, json=BODIES[path]).status_code == 200
    assert engine.options[-1].speculation is None


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_bad_speculation_value_is_a_400(make_client, path):
    client, _ = make_client()
    response = client.post(path, json={**BODIES[path], "speculation": "sometimes"})
    assert response.status_code == 400 and "speculation" in json.dumps(response.json())


@pytest.mark.parametrize("tokens_per_output", [1, 3, 7])
def test_multi_token_outputs_give_the_same_text_stops_and_logprobs(make_client, tokens_per_output):
    client, engine = make_client("The magic word is abracadabra, said the wizard to the crowd.")
    engine.tokens_per_output = tokens_per_output
    body = client.post("/v1/chat/completions", json={"messages": PROMPT, "stop": ["cadab"], "logprobs": True}).json()
    assert body["choices"][0]["message"]["content"] == "The magic word is abra"
    assert body["choices"][0]["finish_reason"] == "stop"
    # the output ends at the token that completes the stop string, as one token at a time would
    tokens_to_stop = len(body["choices"][0]["logprobs"]["content"])
    assert body["usage"]["completion_tokens"] == tokens_to_stop
    assert "".join(e["token"] for e in body["choices"][0]["logprobs"]["content"]).startswith("The magic word is abracadab")
    assert not "".join(e["token"] for e in body["choices"][0]["logprobs"]["content"][:-1]).endswith("cadab")
    whole = client.post("/v1/chat/completions", json={"messages": PROMPT, "logprobs": True, "top_logprobs": 1}).json()
    content = whole["choices"][0]["logprobs"]["content"]
    assert "".join(entry["token"] for entry in content) == whole["choices"][0]["message"]["content"]
    assert whole["usage"]["completion_tokens"] == len(content)
    with client.stream("POST", "/v1/chat/completions", json={"messages": PROMPT, "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == "The magic word is abracadabra, said the wizard to the crowd."


@pytest.mark.parametrize("tokens_per_output", [1, 4])
def test_multi_token_outputs_parse_tool_calls(make_client, tokens_per_output):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    client, engine = make_client(call)
    engine.tokens_per_output = tokens_per_output
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    body = client.post("/v1/chat/completions", json={"messages": PROMPT, "tools": tools}).json()
    [tool_call] = body["choices"][0]["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "get_weather"
    assert json.loads(tool_call["function"]["arguments"]) == {"city": "Paris"}

"""Malformed requests: each gets a 4xx OpenAI error object; the server answers normally afterwards."""

import json

import httpx
import pytest

pytestmark = [pytest.mark.model]

API_KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
USER = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TOO_LONG = "hello " * 9000  # ~9000 tokens: over the 8192-token context


def chat(**fields) -> dict:
    return {"messages": USER, "max_tokens": 2, **fields}


# (case id, method, path, body (dict -> JSON, bytes -> raw), headers, status, param (None: not checked))
CASES = [
    ("bad-json", "POST", CHAT, b'{"messages": [', AUTH, 400, None),
    ("not-json-at-all", "POST", CHAT, b"hello there", AUTH, 400, None),
    ("empty-body", "POST", CHAT, b"", AUTH, 400, None),
    ("body-is-a-list", "POST", CHAT, [], AUTH, 400, None),
    ("missing-messages", "POST", CHAT, {"max_tokens": 2}, AUTH, 400, "messages"),
    ("empty-messages", "POST", CHAT, {"messages": []}, AUTH, 400, "messages"),
    ("messages-not-a-list", "POST", CHAT, {"messages": "hi"}, AUTH, 400, "messages"),
    ("unknown-role", "POST", CHAT, {"messages": [{"role": "bot", "content": "hi"}]}, AUTH, 400, "messages[0].role"),
    ("content-wrong-type", "POST", CHAT, {"messages": [{"role": "user", "content": 5}]}, AUTH, 400,
     "messages[0].content"),
    ("image-part", "POST", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, AUTH, 400,
     "messages[0].content"),
    ("user-without-content", "POST", CHAT, {"messages": [{"role": "user"}]}, AUTH, 400, "messages[0]"),
    ("temperature-5", "POST", CHAT, chat(temperature=5), AUTH, 400, "temperature"),
    ("temperature-string", "POST", CHAT, chat(temperature="hot"), AUTH, 400, "temperature"),
    ("top-p-0", "POST", CHAT, chat(top_p=0), AUTH, 400, "top_p"),
    ("top-p-1.5", "POST", CHAT, chat(top_p=1.5), AUTH, 400, "top_p"),
    ("top-k-negative", "POST", CHAT, chat(top_k=-5), AUTH, 400, "top_k"),
    ("min-p-2", "POST", CHAT, chat(min_p=2), AUTH, 400, "min_p"),
    ("presence-penalty-3", "POST", CHAT, chat(presence_penalty=3), AUTH, 400, "presence_penalty"),
    ("repetition-penalty-0", "POST", CHAT, chat(repetition_penalty=0), AUTH, 400, "repetition_penalty"),
    ("n-0", "POST", CHAT, chat(n=0), AUTH, 400, "n"),
    ("n-1000", "POST", CHAT, chat(n=1000), AUTH, 400, "n"),
    ("max-tokens-negative", "POST", CHAT, chat(max_tokens=-1), AUTH, 400, "max_tokens"),
    ("max-tokens-zero", "POST", CHAT, chat(max_tokens=0), AUTH, 400, "max_tokens"),
    ("max-tokens-string", "POST", CHAT, chat(max_tokens="10"), AUTH, 400, "max_tokens"),
    ("max-tokens-over-context", "POST", CHAT, chat(max_tokens=100_000), AUTH, 400, "prompt"),
    ("logit-bias-out-of-range", "POST", CHAT, chat(logit_bias={"5": 500}), AUTH, 400, None),
    ("logit-bias-bad-key", "POST", CHAT, chat(logit_bias={"abc": 1}), AUTH, 400, None),
    ("logit-bias-out-of-vocab", "POST", CHAT, chat(logit_bias={"99999": 1}), AUTH, 400, "logit_bias"),
    ("stop-list-of-10", "POST", CHAT, chat(stop=[str(i) for i in range(10)]), AUTH, 400, "stop"),
    ("stop-empty-string", "POST", CHAT, chat(stop=[""]), AUTH, 400, "stop[0]"),
    ("stop-token-out-of-vocab", "POST", CHAT, chat(stop_token_ids=[10**6]), AUTH, 400, "stop_token_ids"),
    ("seed-string", "POST", CHAT, chat(seed="x"), AUTH, 400, "seed"),
    ("stream-not-bool", "POST", CHAT, chat(stream="yes"), AUTH, 400, "stream"),
    ("top-logprobs-without-logprobs", "POST", CHAT, chat(top_logprobs=3), AUTH, 400, "top_logprobs"),
    ("top-logprobs-50", "POST", CHAT, chat(logprobs=True, top_logprobs=50), AUTH, 400, "top_logprobs"),
    ("unknown-response-format", "POST", CHAT, chat(response_format={"type": "xml"}), AUTH, 400,
     "response_format.type"),
    ("json-schema-without-schema", "POST", CHAT, chat(response_format={"type": "json_schema"}), AUTH, 400,
     "response_format"),
    ("unusable-json-schema", "POST", CHAT,
     chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}),
     AUTH, 400, "response_format"),
    ("tool-choice-unknown-tool", "POST", CHAT,
     chat(tools=[{"type": "function", "function": {"name": "f"}}],
          tool_choice={"type": "function", "function": {"name": "g"}}), AUTH, 400, None),
    ("tool-choice-required-without-tools", "POST", CHAT, chat(tool_choice="required"), AUTH, 400, None),
    ("tool-choice-bad-string", "POST", CHAT, chat(tool_choice="sometimes"), AUTH, 400, "tool_choice"),
    ("tool-arguments-not-json", "POST", CHAT,
     chat(messages=[{"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                          "function": {"name": "f", "arguments": "{oops"}}]},
                    {"role": "tool", "tool_call_id": "c", "content": "r"}]), AUTH, 400, None),
    ("tool-arguments-not-string", "POST", CHAT,
     chat(messages=[{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                          "function": {"name": "f", "arguments": {}}}]}]),
     AUTH, 400, None),
    ("empty-document", "POST", CHAT, chat(documents=[{"text": ""}]), AUTH, 400, "documents[0].text"),
    ("reserved-template-kwarg", "POST", CHAT, chat(chat_template_kwargs={"messages": []}), AUTH, 400, None),
    ("bad-tool", "POST", CHAT, chat(tools=[{"type": "retrieval"}]), AUTH, 400, None),
    ("empty-cache-salt", "POST", CHAT, chat(cache_salt=""), AUTH, 400, "cache_salt"),
    ("ignore-eos-string", "POST", CHAT, chat(ignore_eos="true"), AUTH, 400, "ignore_eos"),
    ("unknown-model", "POST", CHAT, chat(model="gpt-4"), AUTH, 404, "model"),
    ("prompt-too-long", "POST", CHAT, {"messages": [{"role": "user", "content": TOO_LONG}]}, AUTH, 400, None),
    ("prompt-too-long-streamed", "POST", CHAT,
     {"messages": [{"role": "user", "content": TOO_LONG}], "stream": True}, AUTH, 400, None),
    ("completion-ids-out-of-vocab", "POST", COMPLETIONS, {"prompt": [1, 2, 99999]}, AUTH, 400, None),
    ("completion-negative-id", "POST", COMPLETIONS, {"prompt": [1, -2]}, AUTH, 400, "prompt"),
    ("completion-prompt-wrong-type", "POST", COMPLETIONS, {"prompt": 5}, AUTH, 400, "prompt"),
    ("completion-prompts-mixed", "POST", COMPLETIONS, {"prompt": ["a", [1, 2]]}, AUTH, 400, "prompt"),
    ("completion-prompt-empty-ids", "POST", COMPLETIONS, {"prompt": [[1], []]}, AUTH, 400, "prompt"),
    ("completion-missing-prompt", "POST", COMPLETIONS, {"max_tokens": 2}, AUTH, 400, "prompt"),
    ("completion-empty-prompt", "POST", COMPLETIONS, {"prompt": ""}, AUTH, 400, "prompt"),
    ("completion-echo-not-bool", "POST", COMPLETIONS, {"prompt": "a", "echo": "yes"}, AUTH, 400, "echo"),
    ("stream-options-without-stream", "POST", COMPLETIONS, {"prompt": "a", "stream_options": {}}, AUTH, 400,
     "stream_options"),
    ("temperature-nan", "POST", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', AUTH,
     400, "temperature"),
    ("completion-logprobs-50", "POST", COMPLETIONS, {"prompt": "a", "logprobs": 50}, AUTH, 400, "logprobs"),
    ("completion-unknown-model", "POST", COMPLETIONS, {"prompt": "a", "model": "nope"}, AUTH, 404, "model"),
    ("wrong-method", "GET", CHAT, None, AUTH, 405, None),
    ("wrong-method-put", "PUT", COMPLETIONS, {"prompt": "a"}, AUTH, 405, None),
    ("unknown-route", "GET", "/v1/nope", None, AUTH, 404, None),
    ("unknown-route-root", "POST", "/chat", chat(), AUTH, 404, None),
    ("unknown-model-retrieve", "GET", "/v1/models/gpt-4", None, AUTH, 404, "model"),
    ("body-too-large", "POST", CHAT, {"messages": [{"role": "user", "content": "x" * 1_200_000}]}, AUTH, 413, None),
    ("missing-auth", "POST", CHAT, chat(), {}, 401, None),
    ("wrong-key", "POST", CHAT, chat(), {"Authorization": "Bearer wrong"}, 401, None),
    ("wrong-scheme", "POST", CHAT, chat(), {"Authorization": f"Basic {API_KEY}"}, 401, None),
    ("models-without-auth", "GET", "/v1/models", None, {}, 401, None),
    ("responses-tools-not-a-list", "POST", "/v1/responses", {"input": "hi", "tools": True}, AUTH, 400, "tools"),
    ("dry-base-1", "POST", CHAT, chat(dry_base=1), AUTH, 400, "dry_base"),
    ("dry-multiplier-negative", "POST", COMPLETIONS, {"prompt": "a", "dry_multiplier": -1}, AUTH, 400,
     "dry_multiplier"),
]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_malformed_request_gets_an_error_object(client, case):
    _, method, path, body, headers, status, param = case
    content = body if isinstance(body, bytes) else (None if body is None else json.dumps(body).encode())
    headers = {**headers, "Content-Type": "application/json"}
    response = client.request(method, path, content=content, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if param is not None:
        assert error["param"] == param, error


def test_case_list_is_long_enough():
    assert len(CASES) >= 30


def test_server_answers_normally_afterwards(client):
    response = client.post(CHAT, json=chat(), headers=AUTH)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] is not None
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["backend"] in ("cpu", "torch")

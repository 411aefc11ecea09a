"""What OpenAI clients send works, in-process with the scripted fake engine: null means "not
given" in every optional field of every request body, stream_options needs stream, several
prompts and echo on /v1/completions, NaN / Infinity refused, the official client's None."""

import json
import typing

import pytest
from pydantic import BaseModel, ValidationError

import server.api_anthropic.schemas as anthropic
import server.api_responses.schemas as responses
import server.schemas as schemas
import server.schemas_prompt_cache as prompt_cache
import server.schemas_retrieval as schemas_retrieval
from server.request_body import RequestBody

PROMPT = [{"role": "user", "content": "hi"}]

# The smallest valid body of every request model; a new model must be added here.
MINIMAL_BODIES = {
    schemas.CalledFunction: {"name": "f", "arguments": "{}"},
    schemas.AssistantToolCall: {"id": "c", "function": {"name": "f", "arguments": "{}"}},
    schemas.ChatMessage: {"role": "user", "content": "hi"},
    schemas.StreamOptions: {},
    schemas.FunctionSpec: {"name": "f"},
    schemas.ToolSpec: {"type": "function", "function": {"name": "f"}},
    schemas.NamedFunction: {"name": "f"},
    schemas.NamedToolChoice: {"type": "function", "function": {"name": "f"}},
    schemas.JSONSchemaSpec: {},
    schemas.ResponseFormat: {"type": "text"},
    schemas.RetrievalSpec: {"collection": "c"},
    schemas.Document: {"text": "t"},
    schemas.ChatCompletionRequest: {"messages": PROMPT},
    schemas.CompletionRequest: {"prompt": "a"},
    schemas_retrieval.CreateCollectionRequest: {"name": "c"},
    schemas_retrieval.DocumentIn: {"text": "t"},
    schemas_retrieval.AddDocumentsRequest: {"documents": [{"text": "t"}]},
    schemas_retrieval.SearchRequest: {"query": "q"},
    schemas_retrieval.EmbeddingRequest: {"input": "a"},
    prompt_cache.PromptCacheOptions: {},
    prompt_cache.PromptCacheBreakpoint: {"mode": "explicit"},
    prompt_cache.PromptCacheFields: {},
    # Anthropic Messages and OpenAI Responses share the base (null is "not given" there too)
    anthropic.CacheControl: {"type": "ephemeral"},
    anthropic.TextBlock: {"type": "text", "text": "t"},
    anthropic.ToolUseBlock: {"type": "tool_use", "id": "c", "name": "f", "input": {}},
    anthropic.ToolResultBlock: {"type": "tool_result", "tool_use_id": "c"},
    anthropic.Message: {"role": "user", "content": "hi"},
    anthropic.Tool: {"name": "f", "input_schema": {"type": "object"}},
    anthropic.ToolChoice: {"type": "auto"},
    anthropic.Metadata: {},
    anthropic.JSONOutputFormat: {"type": "json_schema", "schema": {"type": "object"}},
    anthropic.OutputConfig: {},
    anthropic.Thinking: {"type": "disabled"},
    anthropic.Diagnostics: {},
    anthropic.ThreadCreate: {"type": "create"},
    anthropic.ThreadContinue: {"type": "continue", "previous_message_id": "msg_1"},
    anthropic.CountTokensRequest: {"model": "m", "messages": PROMPT},
    anthropic.MessagesRequest: {"model": "m", "messages": PROMPT, "max_tokens": 4},
    responses.TextPart: {"type": "input_text", "text": "t"},
    responses.MessageItem: {"role": "user", "content": "hi"},
    responses.FunctionCallItem: {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    responses.FunctionCallOutputItem: {"type": "function_call_output", "call_id": "c", "output": "o"},
    responses.FunctionTool: {"type": "function", "name": "f"},
    responses.NamedFunction: {"type": "function", "name": "f"},
    responses.TextFormat: {"type": "text"},
    responses.TextConfig: {},
    responses.Reasoning: {},
    responses.ResponsesRequest: {"input": "hi"},
}


def _request_models() -> set[type[BaseModel]]:
    found, todo = set(), list(RequestBody.__subclasses__())
    while todo:
        model = todo.pop()
        if model not in found:
            found.add(model)
            todo.extend(model.__subclasses__())
    return {m for m in found if not m.__name__.startswith("_")}


def test_every_request_model_has_a_minimal_body():
    assert _request_models() == set(MINIMAL_BODIES)


@pytest.mark.parametrize("model", list(MINIMAL_BODIES), ids=lambda m: m.__name__)
def test_null_in_every_optional_field_means_not_given(model):
    minimal = MINIMAL_BODIES[model]
    for name, info in model.model_fields.items():
        if info.is_required():
            continue
        key = info.alias or name
        without = {k: v for k, v in minimal.items() if k != key}
        try:
            expected = model.model_validate_json(json.dumps(without))
        except ValidationError:  # the field is needed here (a user message's content): null is a 400 too
            with pytest.raises(ValidationError):
                model.model_validate_json(json.dumps({**minimal, key: None}))
            continue
        parsed = model.model_validate_json(json.dumps({**minimal, key: None}))
        assert getattr(parsed, name) == getattr(expected, name), key


def test_null_in_a_required_field_is_a_400(make_client):
    client, _ = make_client()
    response = client.post("/v1/chat/completions", json={"messages": None})
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"


def _nullable_top_level_fields(model) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items() if not info.is_required()]


@pytest.mark.parametrize("path,model,base", [
    ("/v1/chat/completions", schemas.ChatCompletionRequest, {"messages": PROMPT}),
    ("/v1/completions", schemas.CompletionRequest, {"prompt": "hi"}),
])
def test_a_body_with_every_optional_field_null_is_answered(make_client, path, model, base):
    client, _ = make_client()
    body = {**base, **{key: None for key in _nullable_top_level_fields(model)}}
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text


def test_the_official_client_passing_none_everywhere(make_client):
    import openai

    client, _ = make_client()
    # not closed: the TestClient (its http_client) is closed by the fixture
    api = openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key="unused", http_client=client, max_retries=0)
    if True:
        nones = dict(stop=None, n=None, temperature=None, top_p=None, seed=None, max_tokens=None,
                     presence_penalty=None, frequency_penalty=None, logit_bias=None, user=None)
        chat = api.chat.completions.create(model="fake-model", messages=PROMPT, logprobs=None, top_logprobs=None,
                                           tools=None, response_format=None, stream_options=None, **nones)
        assert chat.choices[0].message.content == "Hello there, friend."
        completion = api.completions.create(model="fake-model", prompt="hi", echo=None, logprobs=None,
                                            suffix=None, best_of=None, **nones)
        assert completion.choices[0].text == "Hello there, friend."


@pytest.mark.parametrize("path,base", [("/v1/chat/completions", {"messages": PROMPT}),
                                       ("/v1/completions", {"prompt": "hi"})])
def test_stream_options_without_stream_is_a_400(make_client, path, base):
    client, _ = make_client()
    for stream in (False, None):
        response = client.post(path, json={**base, "stream": stream, "stream_options": {"include_usage": True}})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "stream_options" and "stream" in error["message"]
    assert client.post(path, json={**base, "stream": True, "stream_options": {"include_usage": True}}
                       ).status_code == 200


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "temperature": %s}', "temperature"),
    ("/v1/completions", '{"prompt": "hi", "top_p": %s}', "top_p"),
    ("/v1/completions", '{"prompt": "hi", "logit_bias": {"5": %s}}', "logit_bias.5"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
                             '"function": {"name": "f", "parameters": {"maximum": %s}}}]}', None),
    ("/v1/collections/c/documents", '{"documents": [{"text": "t", "metadata": {"x": [%s]}}]}', None),
    ("/v1/collections/c/search", '{"query": "q", "top_k": %s}', "top_k"),
])
def test_nan_and_infinity_are_refused_saying_so(make_client, literal, path, body, param):
    client, _ = make_client()
    response = client.post(path, content=(body % literal).encode(), headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if param is not None:
        assert error["param"] == param
    assert "finite" in error["message"] or "valid integer" in error["message"], error


def test_several_prompts_get_their_choices_indexed_prompt_major(make_client, tokenizer):
    client, engine = make_client("ok")
    body = client.post("/v1/completions", json={"prompt": ["first prompt", "second"], "n": 2,
                                                "max_tokens": 5}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert all(c["text"] == "ok" for c in body["choices"])
    first, second = tokenizer.encode("first prompt"), tokenizer.encode("second")
    assert sorted(map(tuple, engine.prompts)) == sorted([tuple(first)] * 2 + [tuple(second)] * 2)
    assert body["usage"]["prompt_tokens"] == len(first) + len(second)
    assert body["usage"]["completion_tokens"] == 4 * len(tokenizer.encode("ok"))


def test_token_id_prompts_one_or_several(make_client):
    client, engine = make_client("ok")
    assert client.post("/v1/completions", json={"prompt": [5, 6, 7]}).status_code == 200
    assert engine.prompts[-1] == [5, 6, 7]
    body = client.post("/v1/completions", json={"prompt": [[5, 6], [8]]}).json()
    assert len(body["choices"]) == 2 and sorted(engine.prompts[-2:]) == [[5, 6], [8]]
    bad = client.post("/v1/completions", json={"prompt": [[5], []]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


def test_echo_prepends_the_prompt_and_its_logprobs(make_client, tokenizer):
    client, _ = make_client("ok")
    body = client.post("/v1/completions", json={"prompt": "Say it", "echo": True}).json()
    assert body["choices"][0]["text"] == "Say itok"
    body = client.post("/v1/completions", json={"prompt": ["Say it", "x"], "n": 2, "echo": True,
                                                "logprobs": 1}).json()
    prompt_ids = tokenizer.encode("Say it")
    for choice in body["choices"][:2]:
        logprobs = choice["logprobs"]
        assert choice["text"] == "Say itok"
        assert logprobs["tokens"][:len(prompt_ids)] == [tokenizer.decode([t]) for t in prompt_ids]
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        assert len(logprobs["token_logprobs"]) == len(prompt_ids) + len(tokenizer.encode("ok"))
        assert logprobs["text_offset"][0] == 0
    assert body["choices"][2]["text"] == "xok"


def test_streamed_echo_starts_each_choice_with_its_prompt(make_client):
    client, _ = make_client("ok")
    with client.stream("POST", "/v1/completions", json={"prompt": ["A", "B"], "echo": True,
                                                         "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    texts = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == {0: "Aok", 1: "Bok"}


def test_too_many_prompts_are_refused(make_client):
    client, _ = make_client("ok")
    response = client.post("/v1/completions", json={"prompt": ["a"] * (schemas.MAX_PROMPTS + 1)})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


def test_optional_annotations_keep_constraints_inside_the_union():
    """A constraint on `X | None` is applied to None too (a TypeError, a 500): keep it on X."""
    for model in MINIMAL_BODIES:
        for name, info in model.model_fields.items():
            if type(None) in typing.get_args(info.annotation) and not info.is_required():
                assert not info.metadata or all(type(m).__name__ in ("BeforeValidator",) for m in info.metadata), \
                    f"{model.__name__}.{name}: {info.metadata}"


@pytest.mark.parametrize("prompt", [[10**30], [5, 49152], [[1], [2**32]]])
def test_echo_of_token_ids_outside_the_vocabulary_is_a_400(make_client, prompt):
    client, _ = make_client("ok")
    response = client.post("/v1/completions", json={"prompt": prompt, "echo": True})
    assert response.status_code == 400 and "vocabulary" in response.json()["error"]["message"]

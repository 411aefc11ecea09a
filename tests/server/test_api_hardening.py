"""Against the real server on the default model: a body the client stops sending is a client
close (499 in the access log, no traceback); echo with logprobs scores the prompt as the
model does; what the official client sends for None works."""

import json
import socket
import time

import pytest

API_KEY = "test-key-123"  # the shared server's (conftest.py)

pytestmark = [pytest.mark.model]


def test_a_client_that_leaves_mid_body_is_logged_as_a_client_close(server):
    host, port = server.base_url.removeprefix("http://").split(":")
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 1000}]}).encode()
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
                           + f"Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n".encode()
                           + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:100])
        time.sleep(0.3)  # the handler is waiting for the rest of the body
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in server.access_log() if line["route"] == "/v1/chat/completions"]
        if lines and lines[-1]["status"] == 499 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert lines[-1]["status"] == 499 and not lines[-1]["complete"]
    log = "\n".join(server.log_lines())
    assert "client disconnected prematurely" not in log and "internal error" not in log


def test_echo_with_logprobs_scores_the_prompt_as_generation_does(openai_client, http):
    """Greedy generation gives tokens and their logprobs; echoing prompt + those tokens scores
    them again in prefill (without the prefix cache), and the scores agree."""
    prompt = "The capital of France is"
    generated = openai_client.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=4,
                                                 temperature=0, logprobs=2)
    text = generated.choices[0].text
    scored = openai_client.completions.create(model="smollm2-135m-instruct", prompt=prompt + text, max_tokens=1,
                                              temperature=0, logprobs=2, echo=True)
    logprobs = scored.choices[0].logprobs
    assert scored.choices[0].text.startswith(prompt + text)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.text_offset[0] == 0
    num_prompt = scored.usage.prompt_tokens
    assert len(logprobs.tokens) == num_prompt + 1
    assert "".join(logprobs.tokens[:num_prompt]) == prompt + text
    assert scored.usage.prompt_tokens_details.cached_tokens == 0  # scored without the cache
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert all(len(top) == 2 for top in logprobs.top_logprobs[1:])
    # Where the generated tokens sit in the scored prompt (as long as re-tokenizing kept them).
    start = next(i for i in range(num_prompt) if "".join(logprobs.tokens[:i]) == prompt)
    wanted = generated.choices[0].logprobs
    num_same = 0
    while (num_same < len(wanted.tokens) and start + num_same < num_prompt
           and logprobs.tokens[start + num_same] == wanted.tokens[num_same]):
        num_same += 1
    assert num_same >= 2
    assert logprobs.token_logprobs[start:start + num_same] == pytest.approx(wanted.token_logprobs[:num_same],
                                                                            abs=2e-3)


def test_several_prompts_with_the_official_client(openai_client):
    completion = openai_client.completions.create(model="smollm2-135m-instruct", prompt=["One,", "A,", "X"], n=2,
                                                  max_tokens=3, temperature=0, stop=None, seed=None)
    assert [c.index for c in completion.choices] == list(range(6))
    assert completion.choices[0].text == completion.choices[1].text  # greedy: a prompt's choices agree


def test_stop_none_and_stream_options_without_stream(openai_client):
    import openai

    chat = openai_client.chat.completions.create(model="smollm2-135m-instruct", max_tokens=3, stop=None, n=None,
                                                 messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        openai_client.chat.completions.create(model="smollm2-135m-instruct", max_tokens=3,
                                              messages=[{"role": "user", "content": "hi"}],
                                              stream_options={"include_usage": True})


def test_metrics_content_type_is_valid(server):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(server.base_url + "/metrics", timeout=10)
    assert response.headers["content-type"].count("charset") == 1
    assert any(f.name == "radixserve:num_requests_running" for f in text_string_to_metric_families(response.text))

"""Out of the box: the README's curl and 8 everyday questions, sent without max_tokens or any sampling field,
end by themselves (finish_reason "stop") under the server's defaults on the default model, each well inside
the default cap. Sampling is random: the README's curl is sent exactly as the README gives it (no seed), the
questions each with a fixed seed so a failure can be replayed; with the defaults the measurement chose, every
one of the measured answers ended by itself (docs/performance.md). `make test-ootb`; left out of `make test`
(a minute or two of generation)."""

import httpx
import pytest

from bench.defaults_bench import QUESTIONS
from server.generation_defaults import BUILTIN_GENERATION_DEFAULTS

pytestmark = [pytest.mark.ootb, pytest.mark.model, pytest.mark.slow]

README_CURL_BODY = {"model": "smollm2-135m-instruct",
                    "messages": [{"role": "user", "content": "What is the capital of France?"}]}
NUM_EVERYDAY_QUESTIONS = 8


def test_the_readme_curl_and_everyday_questions_end_by_themselves(server, http: httpx.Client):
    assert QUESTIONS[0] == README_CURL_BODY["messages"][0]["content"] and len(QUESTIONS) > NUM_EVERYDAY_QUESTIONS
    answer = http.post("/v1/chat/completions", json=README_CURL_BODY).json()  # exactly the README's curl
    results = [(QUESTIONS[0], answer["choices"][0]["finish_reason"], answer["usage"]["completion_tokens"])]
    for seed, question in enumerate(QUESTIONS[1:1 + NUM_EVERYDAY_QUESTIONS], start=1):
        body = {"model": server.model, "messages": [{"role": "user", "content": question}], "seed": seed}
        answer = http.post("/v1/chat/completions", json=body).json()
        results.append((question, answer["choices"][0]["finish_reason"], answer["usage"]["completion_tokens"]))
    assert all(reason == "stop" for _, reason, _ in results), results
    assert all(num_tokens < BUILTIN_GENERATION_DEFAULTS.max_tokens for *_, num_tokens in results), results

"""Out of the box: the README's curl and everyday questions, sent without max_tokens or any sampling field,
end by themselves (finish_reason "stop") under the server's defaults on the default model, well inside the
default cap. Sampling is random, so each question has a fixed seed (with the defaults the measurement chose,
36 of 40 seeded answers ended by themselves: docs/performance.md), and the test asks most of them to end,
every one within the cap. `make test-ootb`; left out of `make test` (about a minute of generation)."""

import httpx
import pytest

from bench.defaults_bench import QUESTIONS
from server.generation_defaults import BUILTIN_GENERATION_DEFAULTS

pytestmark = [pytest.mark.ootb, pytest.mark.model, pytest.mark.slow]

README_CURL_BODY = {"model": "smollm2-135m-instruct",
                    "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def test_the_readme_curl_and_everyday_questions_end_by_themselves(server, http: httpx.Client):
    assert QUESTIONS[0] == README_CURL_BODY["messages"][0]["content"] and len(QUESTIONS) >= 9
    answer = http.post("/v1/chat/completions", json=README_CURL_BODY).json()  # exactly the README's curl
    results = [(answer["choices"][0]["finish_reason"], answer["usage"]["completion_tokens"])]
    for seed, question in enumerate(QUESTIONS[1:], start=1):
        body = {"model": server.model, "messages": [{"role": "user", "content": question}], "seed": seed}
        answer = http.post("/v1/chat/completions", json=body).json()
        results.append((answer["choices"][0]["finish_reason"], answer["usage"]["completion_tokens"]))
    assert all(num_tokens <= BUILTIN_GENERATION_DEFAULTS.max_tokens for _, num_tokens in results), results
    assert sum(reason == "stop" for reason, _ in results) >= len(results) - 2, results

"""A real server started with --kv-dtype int8 says its capacity and answers through the OpenAI client."""

import re

import httpx
import pytest

from tests.server.conftest import serving

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_an_int8_kv_server_answers_through_the_openai_client(smollm2_dir, tmp_path):
    import openai

    with serving(tmp_path, ["--kv-dtype", "int8"]) as server:
        capacity_lines = [line for line in server.log_lines() if "KV cache of" in line]
        assert len(capacity_lines) == 1 and "KV int8" in capacity_lines[0]
        num_tokens = int(re.search(r"KV cache of (\d+) tokens", capacity_lines[0]).group(1))
        metrics = httpx.get(server.base_url + "/metrics", timeout=10).text
        assert float(re.search(r"^radixserve:kv_cache_capacity_tokens (\S+)$", metrics, re.MULTILINE).group(1)) \
            == num_tokens
        # 256 MiB of float32 pages hold 5696 tokens of SmolLM2-135M (46 KB a token); int8 3.76x that
        assert num_tokens > 3.7 * (256 * 2**20 // (2 * 30 * 3 * 64 * 4 * 16)) * 16
        api = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)
        chat = api.chat.completions.create(model=server.model, max_tokens=12, temperature=0,
                                           messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in chat.choices[0].message.content

"""A real server started with --kv-dtype int8 (or float8 on the torch backend) says its capacity and answers
through the OpenAI client; one asked for float8 on the cpu backend exits with a one-line error."""

import subprocess
import sys

import re

import httpx
import pytest

from tests.server.conftest import serving

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.mark.parametrize("kv_dtype, backend", [("int8", "auto"), ("float8", "torch")])
def test_a_quantized_kv_server_answers_through_the_openai_client(smollm2_dir, tmp_path, kv_dtype, backend):
    import openai

    with serving(tmp_path, ["--kv-dtype", kv_dtype, "--backend", backend]) as server:
        capacity_lines = [line for line in server.log_lines() if "KV cache of" in line]
        assert len(capacity_lines) == 1 and f"KV {kv_dtype}" in capacity_lines[0]
        num_tokens = int(re.search(r"KV cache of (\d+) tokens", capacity_lines[0]).group(1))
        metrics = httpx.get(server.base_url + "/metrics", timeout=10).text
        assert float(re.search(r"^radixserve:kv_cache_capacity_tokens (\S+)$", metrics, re.MULTILINE).group(1)) \
            == num_tokens
        # 256 MiB of float32 pages hold 5696 tokens of SmolLM2-135M (46 KB a token); int8 and float8 3.76x that
        assert num_tokens > 3.7 * (256 * 2**20 // (2 * 30 * 3 * 64 * 4 * 16)) * 16
        api = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=120)
        chat = api.chat.completions.create(model=server.model, max_tokens=12, temperature=0,
                                           messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in chat.choices[0].message.content


def test_float8_on_the_cpu_backend_is_a_one_line_error(smollm2_dir, tmp_path):
    result = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--device", "cpu", "--dtype", "float32",
                             "--kv-dtype", "float8", "--kv-disk-dir", str(tmp_path / "kv")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("radixserve: error: K in float8 cannot be stored on backend cpu") and "--backend torch" in line

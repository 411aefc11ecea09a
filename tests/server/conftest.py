"""A real `radixserve serve` process on the default model, shared by the API tests.

It runs with an API key (from $RADIXSERVE_API_KEY, so the variable is tested
too), a second one from --api-keys-file (tests of what one key cannot see of
another's), its own stored-Responses file and a 1 MB body limit; clients here
send the first key unless a test is about leaving it out.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

API_KEY = "test-key-123"
OTHER_API_KEY = "other-key-456"
MAX_BODY_BYTES = 1_000_000
PAGE_SIZE = 16
STARTUP_TIMEOUT_S = 180


@dataclass
class RunningServer:
    base_url: str
    model: str
    log_path: Path
    process: subprocess.Popen

    @property
    def api_url(self) -> str:
        return self.base_url + "/v1"

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def access_log(self) -> list[dict]:
        return [json.loads(line) for line in self.log_lines() if line.startswith('{"id"')]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(server_dir: Path, extra_args: list[str], env: dict[str, str] | None = None) -> Iterator[RunningServer]:
    """A `radixserve serve` process on the default model (CPU, float32, 256 MiB of KV), logging into
    server_dir, until the block ends."""
    port = _free_port()
    log_path = server_dir / "server.log"
    command = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--kv-cache-memory", "256MiB",
               "--dtype", "float32", "--device", "cpu", "--responses-db", str(server_dir / "responses.sqlite3"),
               *extra_args]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    running = RunningServer(f"http://127.0.0.1:{port}", "smollm2-135m-instruct", log_path, process)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("server did not start:\n" + "\n".join(running.log_lines()[-30:]))
            try:
                if httpx.get(running.base_url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        yield running
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def server(smollm2_dir, tmp_path_factory) -> RunningServer:
    server_dir = tmp_path_factory.mktemp("server")
    (server_dir / "keys.txt").write_text(f"# more keys\n{OTHER_API_KEY}\n")
    with serving(server_dir, ["--max-body-bytes", str(MAX_BODY_BYTES), "--api-keys-file", str(server_dir / "keys.txt")],
                 env=dict(os.environ, RADIXSERVE_API_KEY=API_KEY)) as running:
        yield running


@pytest.fixture
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=120) as client:
        yield client


@pytest.fixture
def openai_client(server):
    import openai

    with openai.OpenAI(base_url=server.api_url, api_key=API_KEY, max_retries=0, timeout=120) as client:
        yield client


def _metric_values(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name with labels: value} (comments skipped)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@pytest.fixture
def scrape(server):
    """scrape() -> the server's metrics as {sample: value}."""
    return lambda: _metric_values(httpx.get(server.base_url + "/metrics", timeout=10).text)


@pytest.fixture
def wait_until_idle(scrape):
    """wait_until_idle() polls /metrics until nothing runs or waits and no KV page is in use;
    returns the last scrape."""

    def wait(timeout_s: float = 10.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout_s
        while True:
            values = scrape()
            idle = (values["radixserve:num_requests_running"] == 0
                    and values["radixserve:num_requests_waiting"] == 0
                    and values["radixserve:kv_cache_usage_perc"] == 0)
            if idle or time.monotonic() > deadline:
                return values
            time.sleep(0.05)

    return wait

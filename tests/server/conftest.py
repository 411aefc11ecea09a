"""Two ways to serve the API tests: a real `radixserve serve` process on the default model
(`server`, shared by the API tests), and the app in-process with a scripted fake engine
(`make_client`: fast, deterministic where a real model is not).

The shared server runs with an API key (from $RADIXSERVE_API_KEY, so the variable is tested
too), a second one from --api-keys-file (tests of what one key cannot see of
another's), its own stored-Responses file and a 1 MB body limit; clients here
send the first key unless a test is about leaving it out.
"""

import asyncio
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
from litestar.testing import TestClient

from assembly.tokenizer import Tokenizer
from engine.engine_handle import EngineFacts
from engine.cached_prefixes import CachedPrefix
from engine.engine_config import EngineConfig
from engine.metrics import EngineMetrics, EngineStats
from engine.request import FinishReason, RequestOutput
from engine.request_options import DEFAULT_REQUEST_OPTIONS
from server.app import create_app
from server.settings import ServerSettings

API_KEY = "test-key-123"
OTHER_API_KEY = "other-key-456"
MODEL = "fake-model"  # the in-process app's served model name
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
               # its own KV disk tier: tests never read pages another run (or checkout) left behind
               "--kv-disk-dir", str(server_dir / "kv"), *extra_args]
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


# ---- the app in-process, with a scripted fake engine (fast, deterministic) ----


class FakeEngine:
    """An EngineHandle (engine/engine_handle.py) answering every request with `script` (token ids) and
    recording closes."""

    precompute_unavailable = None
    cached_prefixes_unavailable = None
    prometheus_collectors = ()

    def __init__(self, config: EngineConfig, script: list[int]):
        self.facts = EngineFacts(vocab_size=49152, eos_token_ids=frozenset({2}), max_model_len=2048,
                                 max_num_request_tokens=2048, backend="fake", backend_description="backend fake",
                                 page_size=config.page_size)
        self.metrics = EngineMetrics()
        self.script = script
        self.num_waiting = 0
        self.failure: Exception | None = None
        self.closed_early: list[str] = []  # request ids whose stream was left before its end
        self.last_finish_reason = FinishReason.LENGTH
        self.pins: list[tuple[list[int], str | None, float]] = []
        self.prompts: list[list[int]] = []
        self.affinity_keys: list[str | None] = []  # each generate's routing hint (prompt_cache_key)
        self.options: list = []  # each generate's RequestOptions
        self.params: list = []  # each generate's SamplingParams
        self.num_cached_tokens = 0  # what each output reports
        self.num_reused_document_tokens = 0
        self.precomputed: list[tuple[list[list[int]], str | None]] = []  # each precompute_documents call
        self.precompute_contexts: list[list[list[int]] | None] = []  # and the contexts it was given
        self.tokens_per_output = 1  # > 1: outputs carry several tokens, as a speculating engine's do
        self.is_shut_down = False
        self.prefix_reads: list[tuple[str | None, int]] = []  # each cached_prefixes call's (salt, limit)

    async def cached_prefixes(self, cache_salt, limit):
        """One made-up prefix of the tenant asked for (engine/cached_prefixes.py walks the real tree)."""
        self.prefix_reads.append((cache_salt, limit))
        return 1700000000.0, [CachedPrefix(num_tokens=32, num_pages=2, num_derived_tokens=0, hit_count=1,
                                           num_ops_since_use=3, num_locking_requests=0, num_pinned_tokens=16,
                                           pin_seconds_left=9.5, head_token_ids=(1, 2), tail_token_ids=())]

    def stats(self) -> EngineStats:
        return EngineStats(num_admitted=0, num_prefilling=0, num_waiting=self.num_waiting, num_pages=128, num_free_pages=128,
                           num_cached_pages=0, num_held_pages=0, num_pages_in_use=0, num_prefix_query_tokens=7,
                           num_prefix_hit_tokens=3)

    async def generate(self, request_id, prompt_token_ids, params, cache_salt=None, affinity_key=None,
                       options=DEFAULT_REQUEST_OPTIONS):
        self.options.append(options)
        self.params.append(params)
        if self.failure is not None:
            raise self.failure
        script = self.script[:params.max_tokens]
        self.prompts.append(list(prompt_token_ids))
        self.affinity_keys.append(affinity_key)
        finished = False
        if self.tokens_per_output > 1:
            async for output in self._multi_token_outputs(request_id, prompt_token_ids, params, script):
                yield output
            return
        try:
            for i, token_id in enumerate(script):
                await asyncio.sleep(0)
                is_last = i == len(script) - 1
                self.metrics.observe("time_to_first_token" if i == 0 else "inter_token_latency", 0.01)
                prompt_logprobs = prompt_top_logprobs = None
                if i == 0 and params.prompt_logprobs is not None:  # a fixed score, of the right shape
                    prompt_logprobs = [None] + [-1.0] * (len(prompt_token_ids) - 1)
                    top = [(token_id, -1.0) for token_id in prompt_token_ids[1:]][:params.prompt_logprobs]
                    prompt_top_logprobs = [None] + [top] * (len(prompt_token_ids) - 1)
                logprobs = top_logprobs = None
                if params.logprobs is not None:
                    logprobs, top_logprobs = [-0.5], [[(token_id, -0.5)][:params.logprobs]]
                yield RequestOutput(request_id, [token_id], logprobs, top_logprobs,
                                    self.last_finish_reason if is_last else None, len(prompt_token_ids),
                                    self.num_cached_tokens, i + 1,
                                    prompt_logprobs=prompt_logprobs, prompt_top_logprobs=prompt_top_logprobs,
                                    num_reused_document_tokens=self.num_reused_document_tokens)
            finished = True
        finally:
            if not finished:
                self.closed_early.append(request_id)

    async def _multi_token_outputs(self, request_id, prompt_token_ids, params, script):
        finished = False
        try:
            for start in range(0, len(script), self.tokens_per_output):
                await asyncio.sleep(0)
                token_ids = script[start:start + self.tokens_per_output]
                is_last = start + len(token_ids) == len(script)
                logprobs = top_logprobs = None
                if params.logprobs is not None:
                    logprobs = [-0.5] * len(token_ids)
                    top_logprobs = [[(t, -0.5)][:params.logprobs] for t in token_ids]
                yield RequestOutput(request_id, token_ids, logprobs, top_logprobs,
                                    self.last_finish_reason if is_last else None, len(prompt_token_ids), 0,
                                    start + len(token_ids))
            finished = True
        finally:
            if not finished:
                self.closed_early.append(request_id)

    def pin(self, token_ids, cache_salt, seconds) -> None:
        self.pins.append((list(token_ids), cache_salt, seconds))

    async def precompute_documents(self, token_id_lists, cache_salt, context_token_id_lists=None) -> int:
        self.precomputed.append(([list(ids) for ids in token_id_lists], cache_salt))
        self.precompute_contexts.append(context_token_id_lists)
        return sum(len(ids) for ids in token_id_lists)  # as if nothing were stored yet

    def shutdown(self) -> None:
        self.is_shut_down = True


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir):
    return Tokenizer(smollm2_dir)


@pytest.fixture(scope="session")
def make_fake_app(smollm2_dir, tokenizer, tmp_path_factory):
    """make_fake_app(text, **settings) -> (app, engines): the app, whose lifespan will build one
    FakeEngine 'generating' `text` into `engines`."""

    def make(text: str = "Hello there, friend.", **settings_fields):
        engines = []

        def factory(config):
            engines.append(FakeEngine(config, tokenizer.encode(text)))
            return engines[-1]

        settings_fields.setdefault("collections_dir", tmp_path_factory.mktemp("collections"))
        settings_fields.setdefault("responses_db", tmp_path_factory.mktemp("responses") / "responses.sqlite3")
        settings_fields.setdefault("engine", EngineConfig(model_dir=smollm2_dir))
        settings = ServerSettings(served_model_name=MODEL, **settings_fields)
        return create_app(settings, engine_factory=factory), engines

    return make


@pytest.fixture
def make_client(make_fake_app):
    """make_client(text, **settings) -> (TestClient, FakeEngine) whose engine 'generates' `text`."""
    clients = []

    def make(text: str = "Hello there, friend.", **settings_fields):
        app, engines = make_fake_app(text, **settings_fields)
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()  # runs the lifespan
        clients.append(client)
        return client, engines[0]

    yield make
    for client in clients:
        client.__exit__(None, None, None)

"""`radixserve serve --replicas 2` against one process, on the default model (this machine only).

Needs Ray Serve (`make install-cluster`); skipped when it is not installed, so a plain
`make test` does not run it. Two servers start: one with 2 replicas x 1 thread, one plain.
"""

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

pytest.importorskip("ray.serve")

pytestmark = [pytest.mark.model, pytest.mark.cluster, pytest.mark.slow]

STARTUP_TIMEOUT_S = 150
SYSTEM = ("You are a careful assistant for questions about the Python standard library. Answer briefly, "
          "name the module and function you mean, and give one short example when it helps the reader.")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(extra_args, log_path):
    port = _free_port()
    command = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--kv-cache-memory", "128MiB",
               "--dtype", "float32", "--device", "cpu", *extra_args]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("server did not start:\n" + log_path.read_text(errors="replace")[-3000:])
        try:
            if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                return process, base_url
        except httpx.TransportError:
            pass
        time.sleep(0.5)


def _stop(process):
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def servers(smollm2_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("replicas")
    cluster, cluster_url = _start(["--replicas", "2", "--threads-per-replica", "1", "--kv-disk-dir", str(logs / "kv"),
                                   "--collections-dir", str(logs / "collections")], logs / "cluster.log")
    try:
        single, single_url = _start([], logs / "single.log")
        try:
            yield cluster_url, single_url, logs
        finally:
            _stop(single)
    finally:
        _stop(cluster)


def _chat(base_url, question, max_tokens=12, session=None):
    headers = {"x-session-id": session} if session else {}
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0}
    response = httpx.post(base_url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def _metric(base_url, name) -> float:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_greedy_outputs_equal_one_process(servers):
    cluster_url, single_url, _ = servers
    for question in ("What does itertools.chain do?", "How do I read a file line by line?",
                     "When should I use collections.deque?"):
        on_cluster = _chat(cluster_url, question)["choices"][0]["message"]["content"]
        on_single = _chat(single_url, question)["choices"][0]["message"]["content"]
        assert on_cluster == on_single


def test_cached_tokens_for_a_repeated_prefix_equal_one_process(servers):
    cluster_url, single_url, _ = servers
    cached = {}
    for name, url in (("cluster", cluster_url), ("single", single_url)):
        _chat(url, "Tell me about functools.partial.")
        cached[name] = _chat(url, "Tell me about functools.lru_cache.")["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached["cluster"] == cached["single"] > 0


def test_health_and_metrics_aggregate_the_replicas(servers):
    cluster_url, _, _ = servers
    health = httpx.get(cluster_url + "/health", timeout=5).json()
    assert health["status"] == "ok" and health["backend"] == "cpu"  # the replicas' backend, as one process reports it
    text = httpx.get(cluster_url + "/metrics", timeout=5).text
    assert len(set(re.findall(r'replica_prefix_cache_queries_total\{replica="([^"]+)"\}', text))) == 2
    assert _metric(cluster_url, "radixserve:prefix_cache_queries_total") > 0


def test_disconnect_aborts_the_request_on_its_replica(servers):
    cluster_url, _, _ = servers
    body = {"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", cluster_url + "/v1/completions", json=body, timeout=60) as response:
        started = time.monotonic()
        lines = response.iter_lines()
        while time.monotonic() - started < 3:  # replicas report every second: let it show as running
            next(lines)
        assert _metric(cluster_url, "radixserve:replica_num_requests_running") == 1
    # 2000 tokens take minutes on one thread; the replica reports it gone within seconds.
    deadline = time.monotonic() + 10
    while _metric(cluster_url, "radixserve:replica_num_requests_running") != 0:
        assert time.monotonic() < deadline, "the request kept running on its replica after the client left"
        time.sleep(0.5)


def test_documents_added_to_a_collection_are_precomputed_on_every_replica(servers):
    """Any replica may serve a question about them: each computes the chunks' KV into its own store, and its
    own disk directory (<fingerprint> and <fingerprint>-2 under the shared --kv-disk-dir)."""
    from bench import corpus

    cluster_url, _, logs = servers
    assert httpx.post(cluster_url + "/v1/collections", json={"name": "kb"}, timeout=10).status_code == 201
    documents = [{"id": f"doc{i}", "text": text} for i, text in enumerate(corpus.documents(3, 150))]
    added = httpx.post(cluster_url + "/v1/collections/kb/documents", json={"documents": documents}, timeout=600).json()
    assert "precompute_skipped" not in added and added["num_precomputed_tokens"] > 0
    time.sleep(2.5)  # replicas report their stats every second
    text = httpx.get(cluster_url + "/metrics", timeout=5).text
    store_bytes = [float(v) for v in re.findall(r'replica_document_reuse_store_bytes\{replica="[^"]+"\} (\S+)', text)]
    assert len(store_bytes) == 2 and store_bytes[0] == store_bytes[1] > 0  # the same spans on both
    directories = [d for d in (logs / "kv").iterdir() if d.is_dir()]
    assert len(directories) == 2 and all(list((d / "documents").glob("*.kvspan")) for d in directories)
    body = {"messages": [{"role": "user", "content": "Which module handles queues?"}], "max_tokens": 2,
            "temperature": 0, "retrieval": {"collection": "kb", "top_k": 3}}
    response = httpx.post(cluster_url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens_details"]["reused_document_tokens"] > 200

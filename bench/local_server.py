"""A server process the bench starts on a free local port, waits for, and stops: radixserve or a peer.

    with radixserve_server(["--no-prefix-cache"]) as url: ...
    with local_server(lambda port: [binary, "--port", str(port), ...], name="llama-server") as url: ...

The process's output goes to a log file; when it exits or never becomes healthy, the
error names the log and quotes its last lines instead of leaving the caller to guess.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 300.0  # the first start may convert the model
STOP_TIMEOUT_S = 30.0
NUM_LOG_LINES_SHOWN = 15
# What the bench runs radixserve with unless told otherwise: the CPU build's fastest path.
RADIXSERVE_DEFAULT_ARGS = ("--dtype", "float32", "--kv-cache-memory", "1GiB")


class ServerStartError(RuntimeError):
    """The server exited or did not answer /health in time; the message quotes its log."""


def free_port() -> int:
    # The port is free when returned; another process could take it before the server binds it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in lines[-NUM_LOG_LINES_SHOWN:])


def _wait_until_healthy(process: subprocess.Popen, url: str, name: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise ServerStartError(f"{name} exited with status {process.returncode}; "
                                   f"last lines of {log_path}:\n{_log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise ServerStartError(f"{name} did not answer {url}/health within {timeout_s:.0f} s; "
                                   f"last lines of {log_path}:\n{_log_tail(log_path)}")
        try:
            # llama-server answers 503 while it loads the model, radixserve refuses connections.
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)


def stop_process(process: subprocess.Popen) -> None:
    """SIGINT, then kill after STOP_TIMEOUT_S; a process already gone is left alone."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)  # both servers shut down gracefully on Ctrl-C
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def local_server(argv_for_port: Callable[[int], Sequence[str]], *, name: str, log_path: Path | None = None,
                 env: dict[str, str] | None = None, cwd: Path | None = None,
                 timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[str]:
    """Run `argv_for_port(port)` on a free port until the block ends; yields its base URL."""
    port = free_port()
    if log_path is None:
        log_path = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(list(argv_for_port(port)), stdout=log, stderr=subprocess.STDOUT,
                                   env=env, cwd=cwd, start_new_session=True)
    try:
        _wait_until_healthy(process, url, name, log_path, timeout_s)
        yield url
    finally:
        stop_process(process)


@contextmanager
def radixserve_server(extra_args: Sequence[str] = (), *, log_path: Path | None = None,
                      source_dir: Path | None = None) -> Iterator[str]:
    """`radixserve serve` on the default model with RADIXSERVE_DEFAULT_ARGS + extra_args (later ones win).
    `source_dir`: a checkout of radixserve to run instead of this one (`python -m` imports from the
    working directory first, ahead of the editable install)."""
    # No API key: the bench's own server is local and short-lived.
    env = {k: v for k, v in os.environ.items() if k != "RADIXSERVE_API_KEY"}
    # A KV disk tier of its own, gone afterwards: a run never reads pages an earlier run left.
    with tempfile.TemporaryDirectory(prefix="radixserve-bench-kv-") as kv_disk_dir:
        args = [*RADIXSERVE_DEFAULT_ARGS, "--kv-disk-dir", kv_disk_dir, *extra_args]
        with local_server(lambda port: [sys.executable, "-m", "server.cli", "serve", "--port", str(port), *args],
                          name="radixserve", log_path=log_path, env=env, cwd=source_dir) as url:
            yield url

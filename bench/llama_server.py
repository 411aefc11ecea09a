"""The llama.cpp peer: find (or build, outside the repository) `llama-server` and run it on the
default model's GGUF file, the same weights radixserve converts.

The binary comes from, in order: the path given, $LLAMA_SERVER, or bench/build_llama_server.sh,
which builds it from the llama.cpp sources in llama-cpp-python's sdist under
$RADIXSERVE_HOME/peers (a one-time build of several minutes). Nothing of llama.cpp's code
enters the repository.
"""

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench.local_server import local_server

BUILD_SCRIPT = Path(__file__).with_name("build_llama_server.sh")
CONTEXT_PER_SLOT = 4096  # tokens; the longest bench prompt + output is well under this
# Prompt caching (`cache_prompt`) is llama-server's default; --cache-reuse also reuses chunks
# of a slot's previous prompt by shifting their KV.
LLAMA_DEFAULT_ARGS = ("--jinja", "--cache-reuse", "256", "--no-webui")


class PeerUnavailable(RuntimeError):
    """No llama-server binary and none could be built; the message says what to do."""


def find_or_build_llama_server(binary: str | None = None) -> Path:
    """The llama-server to run, building it once when none is given."""
    given = binary or os.environ.get("LLAMA_SERVER")
    if given:
        path = Path(given).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise PeerUnavailable(f"LLAMA_SERVER={given} is not an executable file")
        return path
    # The script logs its build to stderr (left to the terminal) and prints the binary's path last.
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise PeerUnavailable(f"building llama-server failed ({BUILD_SCRIPT}, status {result.returncode}); "
                              "pass LLAMA_SERVER=/path/to/llama-server to use an existing binary")
    return Path(result.stdout.strip().splitlines()[-1])


def llama_server_version(binary: Path) -> str:
    try:
        result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown version"
    lines = (result.stdout + result.stderr).strip().splitlines()
    return next((line for line in lines if line.startswith("version")), "unknown version")


def llama_server_argv(binary: Path, gguf_path: Path, port: int, num_slots: int, model_name: str,
                      extra_args: Sequence[str] = ()) -> list[str]:
    return [str(binary), "-m", str(gguf_path), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(num_slots), "--ctx-size", str(num_slots * CONTEXT_PER_SLOT),  # split over the slots
            "--alias", model_name, *LLAMA_DEFAULT_ARGS, *extra_args]


@contextmanager
def llama_server(binary: Path, gguf_path: Path, *, num_slots: int, model_name: str,
                 extra_args: Sequence[str] = (), log_path: Path | None = None) -> Iterator[str]:
    """llama-server on a free port with one slot per concurrent session; yields its base URL."""
    with local_server(lambda port: llama_server_argv(binary, gguf_path, port, num_slots, model_name, extra_args),
                      name="llama-server", log_path=log_path) as url:
        yield url

"""llama.cpp's own model tools, for tests that need files made by them: `convert_hf_to_gguf.py`
and `llama-quantize` (and `llama-server` for agreement checks), built outside the repository by
`make llama-tools` (bench/build_llama_server.sh) from the llama.cpp sources in llama-cpp-python's
sdist. Tests that use them carry the `llama_tools` marker: `make test` leaves them out, `make
test-llama` builds the tools and runs them, and without the tools they skip saying so.

Where the tools are: $RADIXSERVE_LLAMA_CPP_DIR (a llama.cpp source tree with a `build/bin`), else
the build script's default under $RADIXSERVE_HOME/peers (or ~/.cache/radixserve/peers).
"""

import os
from pathlib import Path
from typing import NamedTuple

import pytest

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the build script's default


class LlamaTools(NamedTuple):
    source_dir: Path  # the llama.cpp source tree

    @property
    def convert_script(self) -> Path:
        return self.source_dir / "convert_hf_to_gguf.py"

    @property
    def quantize(self) -> Path:
        return self.source_dir / "build" / "bin" / "llama-quantize"

    @property
    def server(self) -> Path:
        return self.source_dir / "build" / "bin" / "llama-server"


def llama_cpp_dir() -> Path:
    given = os.environ.get("RADIXSERVE_LLAMA_CPP_DIR")
    if given:
        return Path(given).expanduser()
    home = Path(os.environ.get("RADIXSERVE_HOME") or Path.home() / ".cache" / "radixserve").expanduser()
    return home / "peers" / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"


def find_llama_tools() -> LlamaTools | None:
    tools = LlamaTools(llama_cpp_dir())
    if tools.convert_script.is_file() and os.access(tools.quantize, os.X_OK):
        return tools
    return None


def require_llama_tools() -> LlamaTools:
    """The tools, or a skip that says how to get them."""
    tools = find_llama_tools()
    if tools is None:
        pytest.skip(f"llama.cpp tools not built under {llama_cpp_dir()} "
                    "(run `make llama-tools`, or set RADIXSERVE_LLAMA_CPP_DIR)")
    return tools

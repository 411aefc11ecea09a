#!/usr/bin/env bash
# Builds llama.cpp's llama-server (and the other tools named in LLAMA_TARGETS, e.g. llama-quantize)
# OUTSIDE the repository, from the llama.cpp sources that llama-cpp-python's sdist carries (fetched
# with pip from the package index). Nothing of it enters the repository. Prints llama-server's path
# as its last line; the other binaries lie beside it, convert_hf_to_gguf.py in the source root.
#
#   bench/build_llama_server.sh [PEERS_DIR]     (default: $RADIXSERVE_HOME/peers or ~/.cache/radixserve/peers)
#   PIP=.venv/bin/pip JOBS=2 LLAMA_CPP_PYTHON_VERSION=0.3.36 LLAMA_TARGETS="llama-server llama-quantize"
set -euo pipefail

PEERS_DIR="${1:-${RADIXSERVE_HOME:-$HOME/.cache/radixserve}/peers}"
PIP="${PIP:-.venv/bin/pip}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
TARGETS="${LLAMA_TARGETS:-llama-server}"
SRC_DIR="$PEERS_DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
BIN="$SRC_DIR/build/bin/llama-server"

# With AMX off (below): a build that predates that choice is rebuilt.
STAMP="$SRC_DIR/build/.built-without-amx"
built() { [ -f "$STAMP" ] || return 1; for t in $TARGETS; do [ -x "$SRC_DIR/build/bin/$t" ] || return 1; done; }
if built; then echo "$BIN"; exit 0; fi

for tool in cmake c++ make; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "error: '$tool' not found; building llama-server needs cmake and a C++ compiler" \
             "(e.g. apt-get install cmake g++), or pass LLAMA_SERVER=/path/to/llama-server" >&2
        exit 2
    fi
done

mkdir -p "$PEERS_DIR"
SDIST="$PEERS_DIR/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    echo "fetching llama-cpp-python $VERSION sdist (llama.cpp sources) into $PEERS_DIR" >&2
    "$PIP" download "llama-cpp-python==$VERSION" --no-deps --no-binary :all: -d "$PEERS_DIR" >&2
fi
if [ ! -d "$SRC_DIR" ]; then tar -xzf "$SDIST" -C "$PEERS_DIR"; fi

echo "building $TARGETS in $SRC_DIR/build (several minutes on 2 cores)" >&2
# No web UI, no network features: the machine may be offline and the bench needs the API only.
# Native instruction sets except AMX: on an AMX machine (Intel Xeon, KVM, 2026-12-02) this llama.cpp's
# AMX matmul (ggml_backend_amx_mul_mat) crashed with SIGSEGV on the first graph, for Q4_K_M and Q8_0
# files alike, so llama-server could not start. Explicit -mno-amx-* win over -march=native in gcc
# whatever their order; on a CPU without AMX they change nothing. (At run time `--no-repack` would
# avoid the AMX buffers too, but it also drops llama.cpp's repacked AVX2/AVX-512 kernels.)
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$SRC_DIR" -B "$SRC_DIR/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" >&2
cmake --build "$SRC_DIR/build" --target $TARGETS -j "$JOBS" >&2
touch "$STAMP"
echo "$BIN"

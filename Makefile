# Set-up and entry points. `make serve` and `make test` work from a fresh clone.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
# torch is pinned here, installed before the project: on these machines this
# takes the CPU build that lies on disk; a looser requirement would pull a
# multi-GB CUDA build. Override with `make install TORCH_SPEC=...`.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install install-cluster install-browser serve test test-extended test-llama test-ootb llama-tools node-sdk fuzz bench bench-peers clean-venv

install: $(STAMP)

# Re-installs only when pyproject.toml changed (the project itself is editable).
$(STAMP): pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q "$(TORCH_SPEC)"
	$(VPY) -m pip install -q -e ".[test]"
	touch $(STAMP)

serve: install
	$(VENV)/bin/radixserve serve $(SERVE_ARGS)

# The console's browser test (tests/server/test_console_browser.py) drives Debian's headless Chromium
# through chromedriver; `make test` skips it, saying so, when they are missing. Installs them when missing.
install-browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
		echo "chromium and chromedriver are installed"; \
	else \
		apt-get update -q && apt-get install -y -q --no-install-recommends chromium chromium-driver; \
	fi

# Tests that need llama.cpp-made model files (marker llama_tools) are left out here: `make test-llama`;
# so is the out-of-the-box check (marker ootb, about a minute of generation): `make test-ootb`.
test: install
	$(VPY) -m pytest -m "not llama_tools and not ootb and not extended" $(PYTEST_ARGS)

# The heaviest default-model checks on the backends make test leaves them out for (about 2 minutes).
test-extended: install
	$(VPY) -m pytest -m extended $(PYTEST_ARGS)

test-ootb: install
	$(VPY) -m pytest -m ootb $(PYTEST_ARGS)

# llama.cpp's convert_hf_to_gguf.py, llama-quantize and llama-server, built once outside the
# repository (bench/build_llama_server.sh; several minutes on 2 cores), then the tests that use them.
LLAMA_TOOLS_TARGETS := llama-server llama-quantize

llama-tools: install
	LLAMA_TARGETS="$(LLAMA_TOOLS_TARGETS)" PIP=$(VENV)/bin/pip bash bench/build_llama_server.sh

test-llama: llama-tools
	$(VPY) -m pytest -m llama_tools $(PYTEST_ARGS)

# The anthropic Node SDK (@anthropic-ai/sdk), for the test of its toolRunner on message threads
# (tests/server/test_anthropic_node.py, which skips saying why without node or the package): installed
# outside the repository, under $RADIXSERVE_HOME (default ~/.cache/radixserve)/peers/node-anthropic.
NODE_SDK_DIR ?= $(or $(RADIXSERVE_HOME),$(HOME)/.cache/radixserve)/peers/node-anthropic

node-sdk:
	mkdir -p "$(NODE_SDK_DIR)"
	cd "$(NODE_SDK_DIR)" && test -f package.json || (cd "$(NODE_SDK_DIR)" && npm init -y >/dev/null)
	cd "$(NODE_SDK_DIR)" && npm install --no-audit --no-fund @anthropic-ai/sdk

# Schema-driven fuzzing (schemathesis) of the app from its OpenAPI document, FUZZ_EXAMPLES
# examples per route and mode (fitting the schema, and not); the suite runs 15. Prints the
# request count and the 5xx count (which must be 0).
FUZZ_EXAMPLES ?= 300

fuzz: install
	RADIXSERVE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(VPY) -m pytest tests/server/test_fuzz.py -s -q -p no:cacheprovider

# Serving benchmarks (bench/suite.py): the optional `bench` extra (matplotlib) on top of the
# base install. Results: bench/results/<date>.{json,md,png}. `make bench-peers
# LLAMA_SERVER=/path/to/llama-server` uses that binary, else one is built outside the repository.
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(VPY) -m pip install -q -e ".[test,bench]"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(VPY) -m bench.suite $(BENCH_ARGS)

bench-peers: $(BENCH_STAMP)
	$(VPY) -m bench.suite --peers $(if $(LLAMA_SERVER),--llama-server $(LLAMA_SERVER)) $(BENCH_ARGS)

# `radixserve serve --replicas N` (Ray Serve): the optional `cluster` extra on top of the base install.
CLUSTER_STAMP := $(VENV)/.installed-cluster

$(CLUSTER_STAMP): $(STAMP)
	$(VPY) -m pip install -q -e ".[test,cluster]"
	touch $(CLUSTER_STAMP)

install-cluster: $(CLUSTER_STAMP)

clean-venv:
	rm -rf $(VENV)

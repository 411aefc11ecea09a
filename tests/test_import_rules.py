"""The house's import rule: each package imports only the packages below it (docs/architecture.md)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# package -> the project packages it may import (besides itself)
ALLOWED = {
    "kernels": set(),
    "cache": {"kernels"},
    "store": set(),
    "model": {"kernels", "store"},
    "engine": {"cache", "kernels", "model", "store"},
    "assembly": {"retrieval"},
    "retrieval": set(),
    "server": {"kernels", "cache", "store", "model", "engine", "assembly", "retrieval"},
    # beside server/, wrapping it; nothing else imports it (or Ray)
    "replicas": {"kernels", "cache", "store", "model", "engine", "assembly", "retrieval", "server"},
}
# The command line is where the program is put together: `serve --replicas` starts replicas/, lazily.
ALLOWED_IN_FILE = {"server/cli.py": {"replicas"}}
PROJECT_PACKAGES = set(ALLOWED) | {"bench", "tests"}


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & PROJECT_PACKAGES


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_it_may(package):
    bad = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        extra = _imported_packages(path) - ALLOWED[package] - {package} - ALLOWED_IN_FILE.get(relative, set())
        if extra:
            bad[relative] = sorted(extra)
    assert bad == {}, f"imports against the house table: {bad}"


def test_server_reaches_the_engine_only_through_its_async_handle():
    """server/ may use engine's value types and config, but never LLMEngine itself."""
    offenders = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "server").rglob("*.py"))
                 if "engine.llm_engine" in path.read_text() or ".engine.engine" in path.read_text()]
    assert offenders == []


def test_the_serving_bench_talks_http_only():
    engine_users = {path.name for path in (ROOT / "bench").glob("*.py")
                    if _imported_packages(path) - {"bench"}}
    assert engine_users <= {"engine_bench.py", "server_overhead.py", "retrieval_bench.py", "suite.py",
                            "rag_retrieval_bench.py", "agent_tool_loop.py", "local_server.py", "kv_tier_bench.py",
                            "replica_router_cost.py", "speculation_bench.py", "verify_row_costs.py",
                            "document_reuse_quality.py", "document_disk_bench.py", "document_reuse_breakdown.py",
                            "random_gguf.py", "int8_activation_quality.py", "cpu_speed_bench.py",
                            "kv_dtype_quality.py", "kv_dtype_speed.py", "kv_dtype_capacity.py", "decode_products_bench.py",
                            "omp_wait_bench.py", "prefill_attention_bench.py"}

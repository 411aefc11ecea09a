"""The four workloads by name, built fresh (sessions are stateful) from sizes and a seed."""

from collections.abc import Callable

from bench.agent_workload import agent_workload
from bench.rag_workload import rag_workload
from bench.random_workload import random_workload
from bench.shared_prefix_workload import shared_prefix_workload
from bench.workload import Workload
from bench.workload_sizes import WorkloadSizes

WORKLOAD_NAMES = ("agent", "rag", "shared_prefix", "random")


def build_workload(name: str, sizes: WorkloadSizes, seed: int, *, native_tools: bool = False) -> Workload:
    builders: dict[str, Callable[[], Workload]] = {
        "agent": lambda: agent_workload(sizes, seed, native_tools),
        "rag": lambda: rag_workload(sizes, seed),
        "shared_prefix": lambda: shared_prefix_workload(sizes, seed),
        "random": lambda: random_workload(sizes, seed),
    }
    if name not in builders:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOAD_NAMES)}")
    return builders[name]()

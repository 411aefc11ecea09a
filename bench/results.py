"""A bench's results: one ServerRun per server configuration, written as one JSON file."""

import dataclasses
import datetime
import json
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.runner import RunOptions, WorkloadRun
from bench.workload_sizes import WorkloadSizes


@dataclass(frozen=True)
class ServerRun:
    label: str  # e.g. "radixserve (cache on)", "llama.cpp"
    model: str
    runs: tuple[WorkloadRun, ...]
    note: str = ""  # how it was started, what it does not report

    def run_of(self, workload: str) -> WorkloadRun | None:
        return next((r for r in self.runs if r.workload == workload), None)


def timestamp() -> str:
    """Local date and time for file names: 2025-01-31_14-05."""
    return datetime.datetime.now().strftime("%Y-%m-%d_%H-%M")


def results_dict(servers: Sequence[ServerRun], sizes: WorkloadSizes, options: RunOptions) -> dict[str, Any]:
    options_dict = dataclasses.asdict(options)
    options_dict.pop("api_key")
    options_dict["request_rate"] = str(options.request_rate)  # inf is not JSON
    return {
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "num_cpus": os.cpu_count(), "python": platform.python_version()},
        "sizes": dataclasses.asdict(sizes),
        "options": options_dict,
        "servers": [dataclasses.asdict(server) for server in servers],
    }


def write_results(path: Path, servers: Sequence[ServerRun], sizes: WorkloadSizes, options: RunOptions) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results_dict(servers, sizes, options), indent=1) + "\n")

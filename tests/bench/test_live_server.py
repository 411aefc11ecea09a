"""One short end-to-end run of every workload against a live `radixserve serve` subprocess."""

import pytest

from bench.local_server import radixserve_server
from bench.report import markdown_report
from bench.runner import RunOptions
from bench.serve_bench import bench_server
from bench.workload_sizes import QUICK
from bench.workloads import WORKLOAD_NAMES

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_quick_bench_against_radixserve(smollm2_dir, tmp_path):
    options = RunOptions(concurrency=2, num_warmup=1, show_progress=False, timeout_s=120)
    with radixserve_server(["--kv-cache-memory", "256MiB"], log_path=tmp_path / "server.log") as url:
        server = bench_server(url, "radixserve", WORKLOAD_NAMES, QUICK, options)
    assert [run.workload for run in server.runs] == list(WORKLOAD_NAMES)
    for run in server.runs:
        s = run.summary
        assert (s.num_failed, s.num_completed) == (0, len(run.outcomes)), s.first_errors
        assert s.num_output_tokens == QUICK.max_tokens * s.num_completed  # ignore_eos honoured
        assert 0 < s.ttft.median_ms <= s.e2e.median_ms
        assert s.cached_share is not None
    agent = server.run_of("agent")
    later_turns = [o for o in agent.outcomes if o.turn_index > 0]
    # A later turn extends an earlier prompt + reply: at least the shared system prompt is cached.
    assert later_turns and all(o.num_cached_tokens > 0 for o in later_turns)
    assert "| agent | radixserve |" in markdown_report("t", [server], "radixserve", [])

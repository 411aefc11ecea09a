"""The PNG plots render from synthetic runs (matplotlib is a test dependency too)."""

from bench.metrics import RequestOutcome, summarize
from bench.plots import write_plots
from bench.results import ServerRun
from bench.runner import WorkloadRun


def workload_run(name, num_turns):
    outcomes = tuple(RequestOutcome(0, turn, 100 * (turn + 1), 4, 50, 0.1 * (turn + 1), 0.5, (0.1,) * 3, 0.0)
                     for turn in range(num_turns))
    return WorkloadRun(name, name, outcomes, summarize(outcomes, 1.0))


def test_write_plots(tmp_path):
    servers = [ServerRun(label, "m", (workload_run("agent", 3), workload_run("random", 1))) for label in ("a", "b")]
    paths = write_plots(servers, tmp_path / "run")
    assert [p.name for p in paths] == ["run_agent_ttft_by_turn.png", "run_ttft_vs_prompt.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
    only_random = [ServerRun("a", "m", (workload_run("random", 1),))]
    assert [p.name for p in write_plots(only_random, tmp_path / "r")] == ["r_ttft_vs_prompt.png"]

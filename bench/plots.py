"""PNG plots of a bench (matplotlib, the optional `bench` extra): TTFT per agent turn, and
TTFT against prompt length over every workload."""

from collections.abc import Sequence
from pathlib import Path

from bench.metrics import median_ttft_by_turn_s
from bench.results import ServerRun

MARKERS = ("o", "s", "^", "D", "v", "P")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_agent_ttft_by_turn(servers: Sequence[ServerRun], path: Path) -> bool:
    """Median TTFT at each turn of the agent sessions; False when no server ran the agent workload."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plotted = False
    for server in servers:
        if (run := server.run_of("agent")) is None:
            continue
        by_turn = median_ttft_by_turn_s(run.outcomes)
        ax.plot([t + 1 for t in by_turn], [v * 1000 for v in by_turn.values()], marker="o", label=server.label)
        plotted = True
    if plotted:
        ax.set(xlabel="turn of the agent session", ylabel="median TTFT (ms)", title="Agent sessions: TTFT per turn")
        ax.set_ylim(bottom=0)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return plotted


def plot_ttft_vs_prompt_length(servers: Sequence[ServerRun], path: Path) -> None:
    """Every successful request: prompt tokens (as its server counted them) against TTFT."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    workloads = list(dict.fromkeys(r.workload for s in servers for r in s.runs))
    for server_index, server in enumerate(servers):
        for run in server.runs:
            ok = [o for o in run.outcomes if o.is_success]
            ax.scatter([o.num_prompt_tokens for o in ok], [o.ttft_s * 1000 for o in ok], s=14, alpha=0.7,
                       color=colors[server_index % len(colors)],
                       marker=MARKERS[workloads.index(run.workload) % len(MARKERS)],
                       label=f"{server.label}: {run.workload}")
    ax.set(xlabel="prompt tokens", ylabel="TTFT (ms)", title="TTFT vs prompt length")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(servers: Sequence[ServerRun], stem: Path) -> list[Path]:
    """`<stem>_agent_ttft_by_turn.png` and `<stem>_ttft_vs_prompt.png`. Needs matplotlib (`make bench`
    installs it): without it, raises ImportError saying so."""
    try:
        _pyplot()
    except ImportError:
        raise ImportError("the bench plots need matplotlib: pip install -e '.[bench]' (make bench does)") from None
    paths = []
    agent_path = stem.with_name(stem.name + "_agent_ttft_by_turn.png")
    if plot_agent_ttft_by_turn(servers, agent_path):
        paths.append(agent_path)
    length_path = stem.with_name(stem.name + "_ttft_vs_prompt.png")
    plot_ttft_vs_prompt_length(servers, length_path)
    paths.append(length_path)
    return paths

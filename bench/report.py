"""Markdown tables of a bench: every server on every workload, then ratios against a reference."""

from collections.abc import Sequence

from bench.results import ServerRun
from bench.runner import WorkloadRun

NOT_REPORTED = "not reported"


def _cached_share(run: WorkloadRun) -> str:
    share = run.summary.cached_share
    return NOT_REPORTED if share is None else f"{share:.1%}"


def _computed_tokens(run: WorkloadRun) -> str:
    computed = run.summary.num_computed_prompt_tokens
    return NOT_REPORTED if computed is None else str(computed)


def _workload_names(servers: Sequence[ServerRun]) -> list[str]:
    return list(dict.fromkeys(r.workload for server in servers for r in server.runs))


def results_table(servers: Sequence[ServerRun]) -> str:
    lines = ["| workload | server | ok / failed | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p99 ms "
             "| e2e p50 ms | output tok/s | req/s | cached share | prompt tok computed | wall s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for workload in _workload_names(servers):
        for server in servers:
            if (run := server.run_of(workload)) is None:
                continue
            s = run.summary
            lines.append(f"| {workload} | {server.label} | {s.num_completed} / {s.num_failed} "
                         f"| {s.ttft.median_ms:.0f} | {s.ttft.p99_ms:.0f} | {s.tpot.median_ms:.1f} "
                         f"| {s.itl.p99_ms:.0f} | {s.e2e.median_ms:.0f} | {s.output_throughput:.1f} "
                         f"| {s.request_throughput:.2f} | {_cached_share(run)} | {_computed_tokens(run)} "
                         f"| {s.duration_s:.1f} |")
    return "\n".join(lines)


def _ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}x" if denominator > 0 and numerator > 0 else "-"


def ratio_table(servers: Sequence[ServerRun], reference_label: str) -> str:
    """How each other server compares with the reference; above 1x the reference is better."""
    reference = next(s for s in servers if s.label == reference_label)
    lines = [f"| workload | {reference_label} vs | TTFT p50 (other / ref) | TTFT p99 (other / ref) "
             "| output tok/s (ref / other) | wall (other / ref) |", "|---|---|---:|---:|---:|---:|"]
    for workload in _workload_names(servers):
        if (ref := reference.run_of(workload)) is None:
            continue
        for other in servers:
            if other.label == reference_label or (run := other.run_of(workload)) is None:
                continue
            r, o = ref.summary, run.summary
            lines.append(f"| {workload} | {other.label} | {_ratio(o.ttft.median_ms, r.ttft.median_ms)} "
                         f"| {_ratio(o.ttft.p99_ms, r.ttft.p99_ms)} "
                         f"| {_ratio(r.output_throughput, o.output_throughput)} "
                         f"| {_ratio(o.duration_s, r.duration_s)} |")
    return "\n".join(lines)


def markdown_report(title: str, servers: Sequence[ServerRun], reference_label: str, notes: Sequence[str]) -> str:
    parts = [f"# {title}", "", results_table(servers), ""]
    if len(servers) > 1:
        parts += [f"Ratios against {reference_label} (above 1x: {reference_label} is faster):", "",
                  ratio_table(servers, reference_label), ""]
    descriptions = {r.workload: r.description for server in servers for r in server.runs}
    parts += ["Workloads:", ""] + [f"- {name}: {text}" for name, text in descriptions.items()] + [""]
    parts += ["Servers:", ""] + [f"- {s.label}: model `{s.model}`. {s.note}".rstrip() for s in servers]
    if notes:
        parts += [""] + [f"- {note}" for note in notes]
    return "\n".join(parts) + "\n"

"""Document KV reuse on vs off, side by side in one run: the `rag` workload (documents pasted into
the system message) and `rag_collection` (a collection ingested beforehand, documents by `retrieval`).

    .venv/bin/python -m bench.suite --workloads rag            # part of `make bench` when `rag` runs
    .venv/bin/python -m bench.document_reuse_bench [--quick]   # this part alone

Two radixserve servers, `--document-reuse on` and `off` (prefix cache on in both), are up together
and take turns: `rag` on one then the other, then both collections are filled (the reuse-on server
precomputes the chunks' KV at ingest), then `rag_collection` on one then the other. The table puts
them beside llama.cpp's `rag` run when the suite ran it, with the issue's targets: prompt tokens
computed <= 0.6x of reuse off on `rag`, <= 0.15x on `rag_collection`, TTFT p50 <= 0.5x.
"""

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from bench.bench_args import add_bench_arguments, options_from_args, sizes_from_args
from bench.local_server import ServerStartError, radixserve_server
from bench.rag_collection_workload import collection_passages, fill_collection, rag_collection_workload
from bench.results import ServerRun
from bench.runner import EndpointUnreachable, RunOptions, WorkloadRun, discover_model, open_client, run_workload, \
    warm_up
from bench.workload import Workload
from bench.workload_sizes import WorkloadSizes
from bench.workloads import build_workload

REUSE_ON, REUSE_OFF = "radixserve (document reuse on)", "radixserve (document reuse off)"
TARGETS = {  # workload -> (max computed-token ratio, max TTFT p50 ratio), reuse on / reuse off
    "rag": (0.6, 0.5),
    "rag_collection": (0.15, 0.5),
}


async def _run_one(url: str, workload: Workload, options: RunOptions, label: str) -> tuple[str, WorkloadRun]:
    async with open_client(url, options) as client:
        model = await discover_model(client)
        await warm_up(client, model, options)
        return model, await run_workload(client, workload, model=model, options=options, label=label)


def bench_document_reuse(sizes: WorkloadSizes, options: RunOptions, concurrency: int, log_stem: Path,
                         ) -> tuple[list[ServerRun], list[str]]:
    """(one ServerRun per reuse setting, notes). A server that cannot start is reported, not raised."""
    flags = {REUSE_ON: "on", REUSE_OFF: "off"}
    runs: dict[str, list[WorkloadRun]] = {label: [] for label in flags}
    models: dict[str, str] = {}
    notes: list[str] = []
    try:
        with ExitStack() as stack:
            urls = {}
            for label, flag in flags.items():
                collections_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="doc-reuse-bench-"))
                urls[label] = stack.enter_context(radixserve_server(
                    ["--max-num-seqs", str(max(concurrency, 1)), "--document-reuse", flag,
                     "--collections-dir", collections_dir],
                    log_path=Path(f"{log_stem}_document_reuse_{flag}.log")))
            for label, url in urls.items():
                print(f"== {label}: rag", file=sys.stderr)
                models[label], run = asyncio.run(_run_one(url, build_workload("rag", sizes, options.seed), options,
                                                          label))
                runs[label].append(run)
            passages = collection_passages(sizes)
            for label, url in urls.items():
                seconds, num_precomputed = fill_collection(url, passages, options.api_key)
                notes.append(f"{label}: collection of {len(passages)} passages added in {seconds:.1f} s, "
                             f"{num_precomputed} tokens of document KV precomputed at ingest")
            for label, url in urls.items():
                print(f"== {label}: rag_collection", file=sys.stderr)
                runs[label].append(asyncio.run(_run_one(url, rag_collection_workload(sizes, options.seed), options,
                                                        label))[1])
    except (ServerStartError, EndpointUnreachable, RuntimeError) as error:
        print(f"error: document reuse bench not (fully) run: {error}", file=sys.stderr)
        notes.append(f"document reuse bench: not (fully) run: {str(error).splitlines()[0]}")
    servers = [ServerRun(label, models.get(label, "?"), tuple(runs[label]),
                         f"`radixserve serve --document-reuse {flags[label]}` (prefix cache on)")
               for label in flags if runs[label]]
    return servers, notes


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _cell(value: float | None, target: float | None = None) -> str:
    if value is None:
        return "-"
    verdict = "" if target is None else (" (meets)" if value <= target else " (misses)")
    return f"{value:.2f}x{verdict}"


def document_reuse_table(servers: Sequence[ServerRun]) -> str:
    """Reuse on / off / peers per workload, ratios against reuse off, with the targets."""
    by_label = {s.label: s for s in servers}
    off = by_label.get(REUSE_OFF)
    if off is None:
        return ""
    lines = ["| workload | server | TTFT p50 ms | TTFT p99 ms | prompt tok computed | cached share | wall s "
             "| computed / reuse off | TTFT p50 / reuse off | TTFT p99 / reuse off | wall / reuse off |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for workload, (computed_target, ttft_target) in TARGETS.items():
        reference = off.run_of(workload)
        if reference is None:
            continue
        ref = reference.summary
        for server in servers:
            if (run := server.run_of(workload)) is None:
                continue
            s = run.summary
            is_on = server.label == REUSE_ON  # the targets are reuse on's
            share = "-" if s.cached_share is None else f"{s.cached_share:.1%}"
            computed = "-" if s.num_computed_prompt_tokens is None else str(s.num_computed_prompt_tokens)
            computed_ratio = _ratio(s.num_computed_prompt_tokens, ref.num_computed_prompt_tokens)
            ttft_ratio = _ratio(s.ttft.median_ms, ref.ttft.median_ms)
            lines.append(
                f"| {workload} | {server.label} | {s.ttft.median_ms:.0f} | {s.ttft.p99_ms:.0f} | {computed} | {share} "
                f"| {s.duration_s:.1f} | {_cell(computed_ratio, computed_target if is_on else None)} "
                f"| {_cell(ttft_ratio, ttft_target if is_on else None)} "
                f"| {_cell(_ratio(s.ttft.p99_ms, ref.ttft.p99_ms))} | {_cell(_ratio(s.duration_s, ref.duration_s))} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()))
    add_bench_arguments(parser)
    args = parser.parse_args(argv)
    servers, notes = bench_document_reuse(sizes_from_args(args), options_from_args(args), args.concurrency,
                                          args.log_dir / "document_reuse_bench")
    print(document_reuse_table(servers))
    print("\n".join(f"- {note}" for note in notes))
    return 0 if servers else 1


if __name__ == "__main__":
    sys.exit(main())

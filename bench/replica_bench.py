"""Replicas side by side: prefix routing vs Ray Serve's power-of-two router vs one process.

One run, the same workloads against each server in turn (one server at a time, so they do
not share the CPU): `radixserve serve --replicas 2 --threads-per-replica 1` with our prefix
router, the same with `--replica-router pow2`, and the single-process server (2 threads, the
machine's cores). KV memory is equal in total (2 x HALF vs 1 x FULL). Reports cached share,
TTFT p50 and throughput per workload, and prefix routing's cached share as a share of the
single process's (target >= 95%). Needs the cluster extra (make install-cluster).

    python -m bench.replica_bench [--max-tokens 16] [--kv-cache-memory-mib 1024]
"""

import argparse
import asyncio
import json
from dataclasses import replace
from pathlib import Path

from bench.agent_workload import agent_workload
from bench.local_server import radixserve_server
from bench.runner import RunOptions, run_workloads
from bench.shared_prefix_workload import shared_prefix_workload
from bench.workload_sizes import WorkloadSizes


def variants(kv_mib: int) -> dict[str, list[str]]:
    replicas = ["--replicas", "2", "--threads-per-replica", "1", "--kv-cache-memory", f"{kv_mib // 2}MiB"]
    return {"prefix_router": [*replicas, "--replica-router", "prefix"],
            "pow2_router": [*replicas, "--replica-router", "pow2"],
            "one_process": ["--kv-cache-memory", f"{kv_mib}MiB"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--kv-cache-memory-mib", type=int, default=1024, help="total KV memory of each variant")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    sizes = replace(WorkloadSizes(), max_tokens=args.max_tokens, agent_num_sessions=8, agent_num_turns=5)
    options = RunOptions(concurrency=args.concurrency, show_progress=False)
    results = {}
    for name, server_args in variants(args.kv_cache_memory_mib).items():
        workloads = [agent_workload(sizes, seed=0), shared_prefix_workload(sizes, seed=0)]
        with radixserve_server(server_args) as url:
            _, runs = asyncio.run(run_workloads(url, workloads, options, label=name))
        results[name] = {run.workload: {"cached_share": run.summary.cached_share,
                                        "ttft_p50_ms": run.summary.ttft.median_ms,
                                        "output_tok_s": run.summary.output_throughput,
                                        "total_tok_s": run.summary.total_token_throughput,
                                        "num_failed": run.summary.num_failed} for run in runs}
        print(name, json.dumps(results[name]), flush=True)
    print("\n| workload | server | cached share | of one process's | TTFT p50 ms | output tok/s | total tok/s |")
    print("|---|---|---|---|---|---|---|")
    for workload in ("agent", "shared_prefix"):
        single = results["one_process"][workload]["cached_share"] or 0
        for name in results:
            r = results[name][workload]
            share = r["cached_share"] or 0
            print(f"| {workload} | {name} | {share:.3f} | {share / single if single else 0:.1%} | "
                  f"{r['ttft_p50_ms']:.0f} | {r['output_tok_s']:.1f} | {r['total_tok_s']:.0f} |")
    if args.output:
        args.output.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

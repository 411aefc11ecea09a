"""Serving bench against any OpenAI-compatible endpoint: the agent, RAG, shared-prefix and
random workloads, every request streamed, metrics as vLLM's `bench serve` prints them.

    .venv/bin/python -m bench.serve_bench --url http://127.0.0.1:8000 [--workloads agent,rag]
        [--concurrency 4 | --request-rate 2 --burstiness 1] [--quick] [--out results.json]

Talks HTTP only. An unreachable endpoint is one error line (exit status 2); failed requests
are counted, reported and do not stop the run. `make bench` / `make bench-peers`
(bench/suite.py) start the servers themselves and use this module for each.
"""

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.bench_args import add_bench_arguments, options_from_args, sizes_from_args, workload_names_from_args
from bench.report import markdown_report
from bench.results import ServerRun, write_results
from bench.runner import EndpointUnreachable, RunOptions, run_workloads
from bench.workload_sizes import WorkloadSizes
from bench.workloads import build_workload


def bench_server(base_url: str, label: str, workload_names: Sequence[str], sizes: WorkloadSizes,
                 options: RunOptions, *, native_tools: bool = False, model: str | None = None,
                 note: str = "") -> ServerRun:
    """Run the named workloads, built fresh from the seed, one after another against one server."""
    workloads = [build_workload(name, sizes, options.seed, native_tools=native_tools) for name in workload_names]
    model, runs = asyncio.run(run_workloads(base_url, workloads, options, label=label, model=model))
    return ServerRun(label, model, tuple(runs), note)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL, without /v1")
    parser.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    parser.add_argument("--label", default="server", help="the server's name in the table")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    add_bench_arguments(parser)
    args = parser.parse_args(argv)
    sizes, options = sizes_from_args(args), options_from_args(args)
    try:
        server = bench_server(args.url.rstrip("/"), args.label, workload_names_from_args(args), sizes, options,
                              native_tools=args.native_tools, model=args.model)
    except EndpointUnreachable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.out:
        write_results(args.out, [server], sizes, options)
    print(markdown_report(f"Serving bench: {args.url}", [server], server.label, []))
    return 0


if __name__ == "__main__":
    sys.exit(main())

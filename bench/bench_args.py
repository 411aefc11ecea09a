"""Command-line options every serving bench shares: which workloads, how big, how sent."""

import argparse
import dataclasses
import math
import os

from bench.runner import RunOptions
from bench.workload_sizes import QUICK, WorkloadSizes
from bench.workloads import WORKLOAD_NAMES


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", default=",".join(WORKLOAD_NAMES),
                        help=f"comma-separated, from {','.join(WORKLOAD_NAMES)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of seconds")
    parser.add_argument("--max-tokens", type=int, help="output tokens per request (default: 32, quick: 4)")
    parser.add_argument("--concurrency", type=int, default=4, help="sessions in flight (default: 4)")
    parser.add_argument("--request-rate", type=float, default=math.inf,
                        help="sessions started per second, gamma-distributed gaps (default: inf, all at once)")
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 is Poisson (default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-warmup", type=int, default=2, help="untimed requests first (default: 2)")
    parser.add_argument("--no-ignore-eos", action="store_true",
                        help="let the model stop early (output lengths then differ between servers)")
    parser.add_argument("--native-tools", action="store_true",
                        help="agent: send the tools as OpenAI `tools`, not as system-prompt text")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per request (default: 300)")
    parser.add_argument("--api-key", default=os.environ.get("RADIXSERVE_API_KEY"))
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def workload_names_from_args(args: argparse.Namespace) -> list[str]:
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOAD_NAMES]
    if unknown:
        raise SystemExit(f"error: unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOAD_NAMES)}")
    return names


def sizes_from_args(args: argparse.Namespace) -> WorkloadSizes:
    sizes = QUICK if args.quick else WorkloadSizes()
    return dataclasses.replace(sizes, max_tokens=args.max_tokens) if args.max_tokens else sizes


def options_from_args(args: argparse.Namespace) -> RunOptions:
    return RunOptions(concurrency=args.concurrency, request_rate=args.request_rate, burstiness=args.burstiness,
                      seed=args.seed, num_warmup=args.num_warmup, ignore_eos=not args.no_ignore_eos,
                      timeout_s=args.timeout_s, api_key=args.api_key, show_progress=not args.no_progress)

"""`make bench` and `make bench-peers`: start each server, run the four workloads against it, and
write `bench/results/<date>.json`, `<date>.md` (the table, ratios against radixserve with its
cache on) and PNG plots (TTFT per agent turn, TTFT vs prompt length).

    .venv/bin/python -m bench.suite                  # radixserve, prefix cache on and off
    .venv/bin/python -m bench.suite --peers [--llama-server PATH]   # ... and llama.cpp, same GGUF
    .venv/bin/python -m bench.suite --peers --before REF   # ... and radixserve as of a git ref, first

When the `rag` workload runs, document KV reuse is measured too (bench/document_reuse_bench.py:
`--document-reuse on` vs `off`, side by side, on `rag` and on a pre-ingested collection;
`--no-document-reuse` skips it).

Servers run one at a time on the same machine, with the same workloads (same seed, same
bytes); every server gets one slot per concurrent session. A server that cannot start or be
reached is reported and skipped; the others still run.
"""

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from bench.bench_args import add_bench_arguments, options_from_args, sizes_from_args, workload_names_from_args
from bench.document_reuse_bench import bench_document_reuse, document_reuse_table
from bench.llama_server import PeerUnavailable, find_or_build_llama_server, llama_server, llama_server_version
from bench.local_server import RADIXSERVE_DEFAULT_ARGS, ServerStartError, radixserve_server
from bench.plots import write_plots
from bench.report import markdown_report
from bench.results import ServerRun, timestamp, write_results
from bench.runner import EndpointUnreachable
from bench.serve_bench import bench_server

DEFAULT_MODEL = "smollm2-135m-instruct"
CACHE_ON, CACHE_OFF, LLAMA_CPP = "radixserve (cache on)", "radixserve (cache off)", "llama.cpp"
RESULTS_DIR = Path(__file__).with_name("results")
REPO_DIR = Path(__file__).resolve().parent.parent


@contextmanager
def checkout(ref: str) -> Iterator[tuple[Path, str]]:
    """A detached worktree of this repository at `ref`, outside it, removed afterwards -> (its path, short sha)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO_DIR), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    sha = git("rev-parse", "--short", f"{ref}^{{commit}}")
    with tempfile.TemporaryDirectory(prefix="radixserve-before-") as parent:
        path = Path(parent) / "radixserve"
        git("worktree", "add", "--detach", str(path), sha)
        try:
            yield path, sha
        finally:
            git("worktree", "remove", "--force", str(path))


def _server_plans(args: argparse.Namespace, log_stem: Path,
                  ) -> list[tuple[str, Callable[[], AbstractContextManager[str]], Callable[[], str]]]:
    """(label, start the server, describe it) per server; started lazily, one at a time."""
    concurrency = ["--max-num-seqs", str(max(args.concurrency, 1))]
    radix_note = (f"`radixserve serve {' '.join(RADIXSERVE_DEFAULT_ARGS)}` (float32 where it does not say otherwise: "
                  "its kernels and paths as /health's describe() names them)")
    plans = []
    if args.before:
        def start_before() -> AbstractContextManager[str]:
            @contextmanager
            def server() -> Iterator[str]:
                with checkout(args.before) as (path, sha), radixserve_server(
                        concurrency, log_path=Path(f"{log_stem}_before.log"), source_dir=path) as url:
                    yield url
            return server()

        plans.append((f"radixserve before ({args.before})", start_before,
                      lambda: radix_note + f", run from a checkout of {args.before}"))
    plans += [
        (CACHE_ON, lambda: radixserve_server(concurrency, log_path=Path(f"{log_stem}_cache_on.log")),
         lambda: radix_note),
        (CACHE_OFF, lambda: radixserve_server([*concurrency, "--no-prefix-cache"],
                                              log_path=Path(f"{log_stem}_cache_off.log")),
         lambda: radix_note + " --no-prefix-cache"),
    ]
    if args.peers:
        binary: list[Path] = []  # found or built when its turn comes

        def start_llama() -> AbstractContextManager[str]:
            from store.model_store import extract_gguf  # the harness finds the weights; the client talks HTTP

            binary.append(find_or_build_llama_server(args.llama_server))
            return llama_server(binary[-1], extract_gguf(DEFAULT_MODEL, progress=False), num_slots=args.concurrency,
                                model_name=DEFAULT_MODEL, extra_args=shlex.split(args.llama_server_args),
                                log_path=Path(f"{log_stem}_llama_server.log"))

        plans.append((LLAMA_CPP, start_llama,
                      lambda: f"`{binary[-1]}` ({llama_server_version(binary[-1])}), the same GGUF (Q4_1 weights), "
                              f"--parallel {args.concurrency}, prompt cache on {args.llama_server_args}".rstrip()))
    return plans


def _run_servers(args: argparse.Namespace, log_stem: Path) -> tuple[list[ServerRun], list[str]]:
    sizes, options, names = sizes_from_args(args), options_from_args(args), workload_names_from_args(args)
    servers, notes = [], []
    for label, start, describe in _server_plans(args, log_stem):
        print(f"== {label}", file=sys.stderr)
        notes.append(f"{label}: load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs before it started")
        try:
            with start() as url:
                servers.append(bench_server(url, label, names, sizes, options, native_tools=args.native_tools,
                                            note=describe()))
        except (ServerStartError, EndpointUnreachable, PeerUnavailable) as error:
            print(f"error: {label} not run: {error}", file=sys.stderr)
            notes.append(f"{label}: not run: {str(error).splitlines()[0]}")
    return servers, notes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", action="store_true", help="also run llama.cpp's llama-server")
    parser.add_argument("--llama-server", help="path to a llama-server binary (default: $LLAMA_SERVER, else build)")
    parser.add_argument("--llama-server-args", default="",
                        help="extra llama-server options, one string (e.g. '--threads 2 --poll 0')")
    parser.add_argument("--before", metavar="REF",
                        help="also run radixserve as of this git ref (cache on), from a worktree outside the "
                             "repository: before and after in one run")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-document-reuse", action="store_true",
                        help="skip the document reuse on/off servers (run when the rag workload runs)")
    add_bench_arguments(parser)
    args = parser.parse_args(argv)
    sizes, options = sizes_from_args(args), options_from_args(args)
    stem = args.results_dir / (timestamp() + ("_peers" if args.peers else "") + ("_quick" if args.quick else ""))
    args.results_dir.mkdir(parents=True, exist_ok=True)
    servers, notes = _run_servers(args, stem)
    if "rag" in workload_names_from_args(args) and not args.no_document_reuse:
        print("== document reuse on / off", file=sys.stderr)
        reuse_servers, reuse_notes = bench_document_reuse(sizes, options, args.concurrency, stem)
        servers, notes = servers + reuse_servers, notes + reuse_notes
    if not servers:
        print("error: no server ran; nothing to report", file=sys.stderr)
        return 1
    notes.append("Same machine, one server at a time. A load average well above 0 before a server started means "
                 "something else was running: its timings are noisy.")
    write_results(stem.with_suffix(".json"), servers, sizes, options)
    title = "radixserve vs llama.cpp" if args.peers else "radixserve, prefix cache on and off"
    baseline = next((server.label for server in servers if server.label == CACHE_ON), servers[0].label)
    report = markdown_report(title, servers, baseline, notes)
    if reuse_table := document_reuse_table(servers):
        report += "\n## Document KV reuse: on vs off (and peers) on RAG\n\n" + reuse_table + "\n"
    stem.with_suffix(".md").write_text(report)
    written = [stem.with_suffix(".json"), stem.with_suffix(".md"), *write_plots(servers, stem)]
    print(report)
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does the first request after start pay for warm-up? Equal cold prompts, first against the rest.

    .venv/bin/python -m bench.first_request_bench --url http://127.0.0.1:8000   # a server just started
    .venv/bin/python -m bench.first_request_bench                              # starts one per pass

Sends --num-prompts prompts of the same shape (about --num-words words of distinct text each, from
bench/corpus.py, so no prefix is cached) one after another, greedy, --max-tokens each, and prints
each one's seconds, and the first's against the median of the rest. Meant for a freshly started
server: against one that has served before it measures nothing. docs/performance.md has the numbers.
"""

import argparse
import os
import statistics
import sys
import time
from contextlib import nullcontext

import httpx

from bench.corpus import documents
from bench.local_server import radixserve_server


def cpu_seconds(pid: int | None) -> float:
    """The process's user + system CPU seconds so far (0 without a pid): robust where wall time is not,
    on a machine others load."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_prompts(url: str, prompts: tuple[str, ...], max_tokens: int,
                 pid: int | None = None) -> list[tuple[float, float, int]]:
    """Each prompt's (seconds, server CPU seconds, prompt tokens), in order."""
    timings = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for prompt in prompts:
            body = {"messages": [{"role": "user", "content": f"Summarize this text:\n\n{prompt}"}],
                    "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            start, start_cpu = time.perf_counter(), cpu_seconds(pid)
            response = client.post("/v1/chat/completions", json=body)
            seconds = time.perf_counter() - start
            response.raise_for_status()
            timings.append((seconds, cpu_seconds(pid) - start_cpu, response.json()["usage"]["prompt_tokens"]))
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a server started just before (default: start radixserve for each pass)")
    parser.add_argument("--pid", type=int, help="the --url server's process id: its CPU seconds per prompt too")
    parser.add_argument("--passes", type=int, default=1, help="fresh servers, one after another (without --url)")
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--num-words", type=int, default=600, help="about 800 tokens a prompt")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--offset", type=int, default=0, help="which documents of the corpus (another pass, other text)")
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[])
    args = parser.parse_args(argv)

    for index in range(1 if args.url else args.passes):
        start = args.offset + index * args.num_prompts
        prompts = documents(start + args.num_prompts, args.num_words)[start:]
        server = nullcontext(args.url) if args.url else radixserve_server(["--no-kv-disk", *args.server_args])
        with server as url:
            timings = time_prompts(url, prompts, args.max_tokens, args.pid if args.url else None)
        print(f"pass {index}: prompt tokens {[n for _, _, n in timings]}", flush=True)
        for what, values in (("seconds", [s for s, _, _ in timings]), ("server CPU seconds", [c for _, c, _ in timings])):
            if args.pid is None and what != "seconds":
                continue
            rest = statistics.median(values[1:])
            print(f"  {what}: {' '.join(f'{v:.2f}' for v in values)}; first {values[0]:.2f}, rest median {rest:.2f}, "
                  f"first / rest {values[0] / rest:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

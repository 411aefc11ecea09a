"""Which sampling defaults let everyday chat questions end by themselves, and how long they run.

    .venv/bin/python -m bench.defaults_bench                       # starts radixserve on the default model
    .venv/bin/python -m bench.defaults_bench --url http://127.0.0.1:8000 --settings server

Each candidate setting is sent as the request's own sampling fields (the `server` setting sends
none, so the server's defaults apply: the README's curl), with a `max_tokens` cap of --cap,
over the everyday questions below (the README's "What is the capital of France?" first), once
per seed. Per setting: the share of answers that end by themselves (finish_reason "stop"),
their completion tokens and seconds (median and max). One request at a time by default, so the
seconds are one request's; `--concurrency N` sends N at once (finish reasons and tokens of seeded
requests do not depend on it, the seconds do: a table says which it ran). docs/performance.md has the table and the choice (server/generation_defaults.py).
"""

import argparse
import statistics
from concurrent.futures import ThreadPoolExecutor
import sys
import time
from contextlib import nullcontext

import httpx

from bench.local_server import radixserve_server

QUESTIONS = (
    "What is the capital of France?",  # the README's quick start
    "How do I boil an egg?",
    "Can you suggest a name for a grey cat?",
    "What should I pack for a weekend trip to the beach?",
    "Why is the sky blue?",
    "Write a short thank-you note to a colleague who helped me move.",
    "How many days are there in a leap year?",
    "What is a good way to start learning to cook?",
    "Give me three tips for sleeping better.",
    "What is the difference between weather and climate?",
)

# name -> the request's sampling fields (max_tokens aside)
SETTINGS = {
    "server": {},  # none: whatever the server's defaults are
    "openai": {"temperature": 1.0, "top_p": 1.0},  # OpenAI's defaults, radixserve's before
    "llama.cpp": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},  # llama-server's
    "llama.cpp+rep1.1": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1},
    "cool": {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.05},
    "cool+min-p0.1": {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "min_p": 0.1},
    "smollm2-card": {"temperature": 0.2, "top_p": 0.9},  # the model card's example
    "greedy": {"temperature": 0.0},
    # against loops (a 135M model's runaways repeat a line or a list item): penalties on what was generated
    "llama.cpp+presence0.5": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "presence_penalty": 0.5},
    "llama.cpp+presence1.0": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "presence_penalty": 1.0},
    "llama.cpp+frequency0.3": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "frequency_penalty": 0.3},
    # DRY (engine/dry_penalty.py): the penalty grows with the length of the repeat a token would extend
    "llama.cpp+dry0.8": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "dry_multiplier": 0.8},
    "llama.cpp+dry0.8-allowed3": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
                                  "dry_multiplier": 0.8, "dry_allowed_length": 3},
    "llama.cpp+dry0.8+rep1.1": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "dry_multiplier": 0.8,
                                "repetition_penalty": 1.1},
}


def ask(client: httpx.Client, question: str, fields: dict, cap: int | None, seed: int | None) -> dict:
    body = {"messages": [{"role": "user", "content": question}], **fields}
    if seed is not None:
        body["seed"] = seed
    if cap is not None:
        body["max_tokens"] = cap
    start = time.perf_counter()
    response = client.post("/v1/chat/completions", json=body)
    seconds = time.perf_counter() - start
    response.raise_for_status()
    answer = response.json()
    return {"finish_reason": answer["choices"][0]["finish_reason"],
            "tokens": answer["usage"]["completion_tokens"], "seconds": seconds,
            "text": answer["choices"][0]["message"]["content"]}


def summarize(name: str, rows: list[dict]) -> str:
    stopped = sum(row["finish_reason"] == "stop" for row in rows)
    tokens = [row["tokens"] for row in rows]
    seconds = [row["seconds"] for row in rows]
    return (f"| {name} | {stopped}/{len(rows)} | {statistics.median(tokens):.0f} | {max(tokens)} "
            f"| {statistics.median(seconds):.1f} | {max(seconds):.1f} |")


def _seed(text: str) -> int | None:
    return None if text == "none" else int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start radixserve on the default model)")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", type=_seed, nargs="+", default=[1, 2],
                        help="one pass of the questions per seed; 'none' sends no seed (as the README's curl)")
    parser.add_argument("--cap", type=int, default=1024,
                        help="max_tokens sent with each request (0: none, the server's default applies)")
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                        help="more `serve` flags for the server this bench starts (last)")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (seconds then "
                        "are each request's under that load)")
    parser.add_argument("--show-text", action="store_true", help="print each answer's first 100 characters")
    args = parser.parse_args(argv)

    server = nullcontext(args.url) if args.url else radixserve_server(["--no-kv-disk", *args.server_args])
    with server as url, httpx.Client(base_url=url, timeout=600) as client:
        client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        lines = ["| setting | ended by themselves | tokens (median) | tokens (max) | seconds (median) | seconds (max) |",
                 "|---|---|---|---|---|---|"]
        for name in args.settings:
            jobs = [(seed, question) for seed in args.seeds for question in QUESTIONS]
            with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
                rows = list(pool.map(lambda job: ask(client, job[1], SETTINGS[name], args.cap or None, job[0]), jobs))
            for (seed, question), row in zip(jobs, rows):
                print(f"{name} seed {seed}: {row['finish_reason']} {row['tokens']} tokens {row['seconds']:.1f} s"
                      + (f"  {question[:30]!r} {row['text'][-300:]!r}" if args.show_text else ""),
                      file=sys.stderr, flush=True)
            lines.append(summarize(name, rows))
            print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

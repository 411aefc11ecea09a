"""Server overhead on time to first token: TTFT seen by an HTTP client minus the engine's own TTFT.

    .venv/bin/python -m bench.server_overhead [--url http://127.0.0.1:8000] [--api-key KEY] [--num-requests 50]

Without --url it starts `radixserve serve` on a free port (default model, float32,
256 MiB of KV cache) and stops it at the end. Requests go one at a time, streamed,
so each one's engine TTFT is the change of
`radixserve:time_to_first_token_seconds_sum` across it (engine TTFT runs from the
engine thread queuing the request to the first token being sampled). The client
TTFT runs from sending the request to reading the first SSE event (which carries
the first token). Their difference is what HTTP, validation, the chat template,
tokenization, the thread hand-offs and SSE cost; the p50 over all requests is printed.
"""

import argparse
import json
import os
import random
import statistics
import time

import httpx

from bench.local_server import radixserve_server

TTFT_SUM = "radixserve:time_to_first_token_seconds_sum"
TTFT_COUNT = "radixserve:time_to_first_token_seconds_count"
WORDS = ("river", "stone", "lamp", "garden", "cloud", "engine", "paper", "window", "forest", "signal")
NUM_WARMUP = 3


def _metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise RuntimeError(f"/metrics has no {name}")


def _client_ttft(client: httpx.Client, rng: random.Random) -> float:
    topic = " ".join(rng.choice(WORDS) for _ in range(6))
    body = {"messages": [{"role": "user", "content": f"Write one sentence about: {topic}."}],
            "max_tokens": 2, "temperature": 0, "stream": True}
    started = time.perf_counter()
    first = None
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the stream had no events")
    return first


def measure(url: str, api_key: str | None, num_requests: int) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    rng = random.Random(0)
    client_ttfts, engine_ttfts = [], []
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        for _ in range(NUM_WARMUP):
            _client_ttft(client, rng)
        for _ in range(num_requests):
            sum_before, count_before = _metric(client, TTFT_SUM), _metric(client, TTFT_COUNT)
            client_ttft = _client_ttft(client, rng)
            if _metric(client, TTFT_COUNT) != count_before + 1:
                raise RuntimeError("another client is using the server; the engine TTFT cannot be attributed")
            client_ttfts.append(client_ttft)
            engine_ttfts.append(_metric(client, TTFT_SUM) - sum_before)
    overheads = [c - e for c, e in zip(client_ttfts, engine_ttfts)]
    return {
        "client_ttft_p50_ms": statistics.median(client_ttfts) * 1000,
        "engine_ttft_p50_ms": statistics.median(engine_ttfts) * 1000,
        "overhead_p50_ms": statistics.median(overheads) * 1000,
        "overhead_p90_ms": statistics.quantiles(overheads, n=10)[-1] * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--api-key", default=os.environ.get("RADIXSERVE_API_KEY"))
    parser.add_argument("--num-requests", type=int, default=50)
    args = parser.parse_args()
    if args.url:
        results = measure(args.url, args.api_key, args.num_requests)
    else:
        with radixserve_server(["--kv-cache-memory", "256MiB"]) as url:
            results = measure(url, None, args.num_requests)
    print(json.dumps({k: round(v, 2) for k, v in results.items()}))
    print(f"server overhead on TTFT, p50 over {args.num_requests} requests: {results['overhead_p50_ms']:.1f} ms")


if __name__ == "__main__":
    main()

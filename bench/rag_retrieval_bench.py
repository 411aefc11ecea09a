"""Server-side RAG: TTFT of chat completions with `retrieval`, prefix cache on vs off, per document order.

    .venv/bin/python -m bench.rag_retrieval_bench [--num-documents 200] [--num-requests 48] [--top-k 4]

radixserve only (the `retrieval` extension is ours). A collection is filled once
with corpus passages (bench/corpus.py) in a temporary collections directory; then,
for each configuration (prefix cache on with `--rag-order relevance`, on with
`canonical`, and off), a fresh server answers the same requests: each asks about one
passage drawn with Zipf popularity, its query made of that passage's words, so the
search returns popular passages again and again, as real RAG traffic does. TTFT
includes embedding the query and the FAISS search. Printed: TTFT mean / p50 / p99
and the cached share of prompt tokens per configuration.
"""

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench import corpus
from bench.local_server import ServerStartError, radixserve_server
from bench.rag_workload import RAG_INSTRUCTIONS, zipf_weights
from bench.runner import RunOptions, discover_model, open_client, run_workload, warm_up
from bench.workload import ChatRequest, SingleRequest, Workload

COLLECTION = "bench-corpus"
CONFIGURATIONS = (("cache on, relevance order", ["--rag-order", "relevance"]),
                  ("cache on, canonical order", ["--rag-order", "canonical"]),
                  ("cache off", ["--no-prefix-cache"]))


def build_requests(passages: tuple[str, ...], args) -> Workload:
    rng = random.Random(f"{args.seed}-rag-retrieval")
    weights = zipf_weights(len(passages), args.zipf_exponent)
    sessions = []
    for _ in range(args.num_requests):
        words = passages[rng.choices(range(len(passages)), weights)[0]].split()
        start = rng.randrange(max(1, len(words) - 12))
        query = " ".join(words[start:start + 12])
        messages = ({"role": "system", "content": RAG_INSTRUCTIONS},
                    {"role": "user", "content": f"What do the documents say about: {query}?"})
        retrieval = {"retrieval": {"collection": COLLECTION, "top_k": args.top_k, "query": query}}
        sessions.append(SingleRequest(ChatRequest(messages, args.max_tokens, extra_body=retrieval)))
    return Workload("rag-retrieval", f"{args.num_requests} requests, top-{args.top_k} of {len(passages)} "
                    f"passages (Zipf s={args.zipf_exponent})", sessions)


async def fill_collection(base_url: str, passages: tuple[str, ...]) -> float:
    """Create the collection and add the passages; returns seconds taken."""
    started = time.perf_counter()
    async with open_client(base_url, RunOptions(timeout_s=3600)) as client:
        response = await client.post("/v1/collections", json={"name": COLLECTION})
        if response.status_code != 201:
            raise RuntimeError(f"creating the collection: HTTP {response.status_code}: {response.text[:200]}")
        for i in range(0, len(passages), 64):
            batch = [{"id": f"passage-{j:05d}", "text": text} for j, text in enumerate(passages[i:i + 64], start=i)]
            response = await client.post(f"/v1/collections/{COLLECTION}/documents", json={"documents": batch})
            if response.status_code != 200:
                raise RuntimeError(f"adding documents: HTTP {response.status_code}: {response.text[:200]}")
    return time.perf_counter() - started


async def measure(base_url: str, workload: Workload, options: RunOptions, label: str):
    async with open_client(base_url, options) as client:
        model = await discover_model(client)
        await warm_up(client, model, options)
        return await run_workload(client, workload, model=model, options=options, label=label)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-documents", type=int, default=200)
    parser.add_argument("--document-words", type=int, default=120)
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--zipf-exponent", type=float, default=1.1)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    passages = corpus.documents(args.num_documents, args.document_words)
    options = RunOptions(concurrency=args.concurrency, seed=args.seed, num_warmup=1, ignore_eos=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rag-bench-") as collections_dir:
        try:
            for index, (label, server_args) in enumerate(CONFIGURATIONS):
                with radixserve_server(["--collections-dir", collections_dir, *server_args]) as url:
                    if index == 0:
                        seconds = asyncio.run(fill_collection(url, passages))
                        print(f"collection: {len(passages)} passages embedded and stored in {seconds:.1f} s "
                              f"({len(passages) / seconds:.1f} documents/s, through HTTP)", file=sys.stderr)
                    run = asyncio.run(measure(url, build_requests(passages, args), options, label))
                rows.append((label, run))
        except (ServerStartError, RuntimeError, httpx.HTTPError) as error:
            print(f"rag_retrieval_bench: error: {error}", file=sys.stderr)
            return 1
    print(f"\n{rows[0][1].description}, concurrency {args.concurrency}, max_tokens {args.max_tokens}\n")
    print("| configuration | TTFT mean ms | TTFT p50 ms | TTFT p99 ms | cached share | failed |")
    print("|---|---|---|---|---|---|")
    for label, run in rows:
        s = run.summary
        print(f"| {label} | {s.ttft.mean_ms:.0f} | {s.ttft.median_ms:.0f} | {s.ttft.p99_ms:.0f} | "
              f"{s.cached_share if s.cached_share is not None else float('nan'):.3f} | {s.num_failed} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Retrieval in-process: embedding throughput, and search latency at 10k chunks (Flat vs HNSW).

    .venv/bin/python -m bench.retrieval_bench [--num-chunks 10000] [--embed-sample 256] [--embed-all]

Corpus: docstrings of the Python files of this interpreter's standard library and
site-packages (real English, no download), read with `ast` (nothing is imported), chunked
with the collections' own chunker (200 word-pieces, 32 overlap by default).

1. Embedding: `--embed-sample` chunks through `Embedder.embed` (batched): chunks/s, tokens/s.
2. FAISS search over `--num-chunks` vectors, Flat and HNSW, one query at a time: p50/p99 ms.
   With `--embed-all` every chunk is embedded (minutes to hours on a small CPU); otherwise the
   sample's real vectors are topped up to the size with noisy copies of them (Flat's cost
   does not depend on the values; HNSW's recall is measured against Flat on the same data).
3. End to end, `Collections.search` (embed the query, FAISS, SQLite rows) on a collection of
   that size, its vectors written straight into the store: p50/p99 ms.
"""

import argparse
import ast
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from store.model_store import pull
from retrieval.chunking import Chunk, ChunkingConfig, chunk_text
from retrieval.collections import Collections
from retrieval.collection_store import CollectionStore, EmbeddedDocument
from retrieval.embedder import Embedder
from retrieval.vector_index import VectorIndex

QUERIES = ["how do I parse a date string", "open a file for reading and writing", "compress data with zlib",
           "matrix multiplication of two tensors", "send an HTTP request with headers", "sort a list in place",
           "thread pool executor futures", "regular expression groups", "random number generator seed",
           "decode bytes as UTF-8"]


def docstrings(min_chars: int) -> list[str]:
    """Docstrings of modules, classes and functions, one text per file, until `min_chars`."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    texts, total = [], 0
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
                continue
            nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef)))]
            parts = [d for d in (ast.get_docstring(n) for n in nodes) if d and len(d) > 80]
            if parts:
                texts.append("\n\n".join(parts))
                total += len(texts[-1])
                if total >= min_chars:
                    return texts
    return texts


def corpus_chunks(embedder: Embedder, num_chunks: int, config: ChunkingConfig) -> list[str]:
    chunks = []
    for text in docstrings(min_chars=num_chunks * 1200):
        chunks += [c.text for c in chunk_text(text, embedder.token_spans(text), config)]
        if len(chunks) >= num_chunks:
            return chunks[:num_chunks]
    raise SystemExit(f"only {len(chunks)} chunks of docstrings found; ask for fewer")


def percentiles_ms(seconds: list[float]) -> tuple[float, float]:
    ms = sorted(s * 1000 for s in seconds)
    return statistics.median(ms), ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]


def top_up(vectors: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
    """`vectors` followed by noisy unit copies of them, `size` rows in all."""
    rng = np.random.default_rng(seed)
    extra = vectors[rng.integers(0, len(vectors), size - len(vectors))]
    extra = extra + rng.normal(0, 0.05, extra.shape).astype(np.float32)
    extra /= np.linalg.norm(extra, axis=1, keepdims=True)
    return np.concatenate([vectors, extra]).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-chunks", type=int, default=10_000)
    parser.add_argument("--embed-sample", type=int, default=256)
    parser.add_argument("--embed-all", action="store_true")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-queries", type=int, default=500)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    embedder = Embedder(pull("all-minilm-l6-v2", progress=False), batch_size=args.batch_size, device=args.device)
    config = ChunkingConfig()
    texts = corpus_chunks(embedder, args.num_chunks, config)
    num_embedded = args.num_chunks if args.embed_all else args.embed_sample
    embedder.embed(texts[:args.batch_size])  # warm-up
    start = time.perf_counter()
    batch = embedder.embed(texts[:num_embedded])
    seconds = time.perf_counter() - start
    num_tokens = sum(batch.num_tokens)
    print(f"embedding: {num_embedded} chunks ({num_tokens / num_embedded:.0f} word-pieces avg, batch "
          f"{args.batch_size}, {args.device}) in {seconds:.1f} s: {num_embedded / seconds:.1f} chunks/s, "
          f"{num_tokens / seconds:.0f} tokens/s")
    vectors = batch.vectors if args.embed_all else top_up(batch.vectors, args.num_chunks)

    rng = np.random.default_rng(1)
    queries = top_up(vectors[rng.integers(0, len(vectors), 16)], args.num_queries + 16, seed=2)[16:]
    chunk_ids = np.arange(args.num_chunks, dtype=np.int64)
    flat_top = None
    for kind in ("flat", "hnsw"):
        start = time.perf_counter()
        index = VectorIndex.build(kind, embedder.dim, 0, chunk_ids, vectors)
        build_s = time.perf_counter() - start
        latencies, found = [], []
        for query in queries:
            start = time.perf_counter()
            hits = index.search(query, 10)
            latencies.append(time.perf_counter() - start)
            found.append(set(hits.chunk_ids.tolist()))
        if kind == "flat":
            flat_top = found
        recall = np.mean([len(f & t) / 10 for f, t in zip(found, flat_top)])
        p50, p99 = percentiles_ms(latencies)
        print(f"faiss {kind:4s} @ {args.num_chunks} chunks: build {build_s:.2f} s, top-10 search p50 {p50:.3f} ms, "
              f"p99 {p99:.3f} ms, recall@10 vs flat {recall:.3f}")

    with tempfile.TemporaryDirectory() as root:
        collections = Collections(Path(root), lambda: embedder)
        collections.create("bench", index_kind="flat")
        store = CollectionStore(Path(root) / "bench" / "store.sqlite3")
        store.set_meta({"embedding_model": embedder.name, "dim": str(embedder.dim)})
        step = 500
        for first in range(0, args.num_chunks, step):
            store.put_documents([EmbeddedDocument(f"doc{i}", texts[i], [Chunk(texts[i], 0, len(texts[i]), 0)],
                                                  vectors[i:i + 1]) for i in range(first, min(first + step, len(texts)))])
        store.close()
        collections.search("bench", "warm up", 10)  # builds the index from SQLite
        latencies = []
        for i in range(200):
            start = time.perf_counter()
            collections.search("bench", QUERIES[i % len(QUERIES)], 10)
            latencies.append(time.perf_counter() - start)
        p50, p99 = percentiles_ms(latencies)
        print(f"Collections.search (embed query + faiss flat + sqlite) @ {args.num_chunks} chunks: "
              f"p50 {p50:.1f} ms, p99 {p99:.1f} ms")
        collections.close()
    print(f"python {sys.version.split()[0]}, torch threads {__import__('torch').get_num_threads()}")


if __name__ == "__main__":
    main()

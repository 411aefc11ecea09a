"""The document store on disk, in-process: what the first RAG question after a restart costs.

    .venv/bin/python -m bench.document_disk_bench [--model NAME|PATH] [--repeats 3] [--documents 4]

Documents (random token ids, DOCUMENT_TOKENS each) are precomputed by an engine with the KV disk tier,
which is then closed. Three engines answer the same prompts (a short system prompt, the documents in
a new order, a question), interleaved per repeat, each a prompt it has not seen:
  restarted   a new engine on the same disk directory: the documents come from the store's disk copy
  in-memory   an engine that precomputed the same documents itself (no disk): the in-memory hit
  cold        an engine with an empty store (a restart without the disk copy): everything computed
Reported: TTFT p50 of each, prompt tokens computed, the restarted / cold and restarted / in-memory
ratios, and whether the restarted engine's outputs equal the in-memory ones (they must).
"""

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from engine.document_reuse_config import DocumentReuseConfig
from engine.engine_config import EngineConfig
from engine.kv_disk_config import KVDiskConfig
from engine.llm_engine import LLMEngine
from engine.request_options import RequestOptions
from engine.sampling_params import SamplingParams
from model.config import ModelConfig
from store.model_store import DEFAULT_MODEL, pull

SYSTEM_TOKENS, DOCUMENT_TOKENS, QUESTION_TOKENS = 48, 256, 32
ANSWER_TOKENS = 4


def _engine(model_dir: Path, kv_disk_dir: Path | None) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=256 << 20,
                                  max_num_batched_tokens=2048, kv_disk=KVDiskConfig(directory=kv_disk_dir),
                                  documents=DocumentReuseConfig(enabled=True)))


def _prompt(system, documents, question) -> tuple[list[int], RequestOptions]:
    tokens, spans = list(system), []
    for document in documents:
        spans.append((len(tokens), len(tokens) + len(document)))
        tokens += document
    return tokens + question, RequestOptions(document_reuse=True, document_spans=tuple(spans))


def _run(engine: LLMEngine, prompt: list[int], options: RequestOptions) -> tuple[float, int, list[int]]:
    """(TTFT seconds, prompt tokens computed, output ids) of one greedy request alone."""
    params = SamplingParams(max_tokens=ANSWER_TOKENS, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    request = engine.add_request(f"bench-{time.perf_counter_ns()}", prompt, params, None, options)
    ttft = None
    while not request.is_finished:
        engine.step()
        if ttft is None and request.output_token_ids:
            ttft = time.perf_counter() - started
    return ttft, len(prompt) - request.num_cached_tokens, list(request.output_token_ids)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--documents", type=int, default=4, help="documents per prompt")
    args = parser.parse_args(argv)
    model_dir = Path(args.model) if Path(args.model).is_dir() else pull(args.model, progress=False)
    vocab_size = ModelConfig.from_model_dir(model_dir).vocab_size
    rng = random.Random(0)
    tokens = lambda n: [rng.randrange(100, vocab_size) for _ in range(n)]  # noqa: E731
    # each prompt its own documents (the first set for the warm-up), so every timed one loads from disk
    document_sets = [[tokens(DOCUMENT_TOKENS) for _ in range(args.documents)] for _ in range(args.repeats + 1)]
    documents = [document for document_set in document_sets for document in document_set]
    system = tokens(SYSTEM_TOKENS)
    with tempfile.TemporaryDirectory(prefix="radixserve-document-disk-") as root:
        first = _engine(model_dir, Path(root))
        first.precompute_documents(documents)
        first.close()
        engines = {"restarted": _engine(model_dir, Path(root)), "in-memory": _engine(model_dir, None),
                   "cold": _engine(model_dir, None)}
        engines["in-memory"].precompute_documents(documents)
        for engine in engines.values():  # the same shapes once, so no timing pays a first use
            _run(engine, *_prompt(system, document_sets[0][::-1], tokens(QUESTION_TOKENS)))
        ttfts = {name: [] for name in engines}
        computed = {name: [] for name in engines}
        same_output = True
        for document_set in document_sets[1:]:
            order = rng.sample(document_set, len(document_set))
            prompt, options = _prompt(system, order, tokens(QUESTION_TOKENS))
            outputs = {}
            for name, engine in engines.items():
                ttft, num_computed, outputs[name] = _run(engine, prompt, options)
                ttfts[name].append(ttft)
                computed[name].append(num_computed)
            same_output &= outputs["restarted"] == outputs["in-memory"]
        stats = engines["restarted"].stats()
        load = engines["restarted"].metrics.document_disk_load
        for engine in engines.values():
            engine.close()
    p50 = {name: statistics.median(values) for name, values in ttfts.items()}
    print(f"{args.documents} documents of {DOCUMENT_TOKENS} tokens a prompt, {args.repeats} prompts, "
          f"prompt {len(prompt)} tokens")
    print(f"{'engine':<12}{'TTFT p50 s':>12}{'computed':>10}")
    for name in engines:
        print(f"{name:<12}{p50[name]:>12.3f}{statistics.mean(computed[name]):>10.0f}")
    print(f"restarted / cold TTFT {p50['restarted'] / p50['cold']:.2f}x, restarted / in-memory "
          f"{p50['restarted'] / p50['in-memory']:.2f}x; spans loaded from disk {stats.documents.num_disk_hits} "
          f"({1000 * load.total_seconds / max(1, load.count):.1f} ms each); outputs equal in-memory: {same_output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""In-process engine benchmark (no HTTP), radixserve and HF transformers side by side.

    .venv/bin/python -m bench.engine_bench [--dtypes float32,bfloat16] [--skip-hf] [--skip-rss]

Prints one table (each timing the median of 3 runs; in float32 on CPU radixserve runs twice, the two
engines loaded together and every run alternating between them: decode over the GGUF blocks the model
ships in, the default, and over float32 weights alone): cold prefill tok/s
at 1k/2k/4k prompt tokens, TTFT of 32 new
tokens after a cached 2k prefix as a fraction of the cold 2k TTFT, batch-1 decode
tok/s, aggregate decode tok/s at 16 concurrent sequences; then process RSS after
1,000 mixed requests against RSS after the first 10. Every figure comes from the
same run on the same weights, so ratios are comparable on a noisy machine.
"""

import argparse
import gc
import random
import time
from pathlib import Path

import torch

from engine.engine_config import EngineConfig
from store.block_file import BLOCKS_FILE
from engine.llm_engine import LLMEngine
from engine.request import Request
from store.model_store import pull
from engine.sampling_params import SamplingParams

PREFILL_LENGTHS = (1024, 2048, 4096)
REPEATS = 3  # each timing is the median of this many runs (the machines are noisy)
DECODE_TOKENS = 64
NUM_CONCURRENT = 16
# Enough for a 4k prompt or 16 x 97 tokens of SmolLM2 several times over, and small enough that the
# variants' engines fit in memory together (bench_radixserve loads them at once).
KV_CACHE_BYTES = 512 << 20


def _random_prompt(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    return [rng.randrange(100, vocab_size) for _ in range(length)]


def _median(values) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def run_alone(engine: LLMEngine, prompt: list[int], max_tokens: int) -> tuple[float, float, Request]:
    """(seconds to first token, seconds in all, the finished request) for one greedy request alone;
    the in-process benches (this one, kv_tier_bench) all time requests this way."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    request = engine.add_request(f"bench-{time.perf_counter_ns()}", prompt, params)
    started = time.perf_counter()
    first = None
    while engine.has_unfinished():
        engine.step()
        if first is None and request.output_token_ids:
            first = time.perf_counter() - started
    return first, time.perf_counter() - started, request


def _time_request(engine: LLMEngine, prompt: list[int], max_tokens: int) -> tuple[float, float]:
    """(seconds to first token, seconds in all) for one request alone."""
    return run_alone(engine, prompt, max_tokens)[:2]


def bench_radixserve(model_dir: Path, dtype: str, vocab_size: int, device: str,
                     variants: dict[str, dict]) -> dict[str, dict[str, float]]:
    """One engine per variant (EngineConfig overrides), all loaded at once and measured in
    turn, every repeat of every metric alternating between them: a noisy neighbour then
    slows every variant alike instead of whichever happened to run first. -> variant -> metrics."""
    rng = random.Random(0)
    engines = {name: LLMEngine(EngineConfig(model_dir=model_dir, device=device, dtype=dtype,
                                            kv_cache_bytes=KV_CACHE_BYTES, max_num_batched_tokens=4096, **fields))
               for name, fields in variants.items()}
    results: dict[str, dict[str, float]] = {name: {} for name in engines}
    for engine in engines.values():
        print(f"  {engine.backend.describe()}", flush=True)
        _time_request(engine, _random_prompt(rng, 64, vocab_size), 2)  # warm-up

    def alternate(metric: str, measure, summarize) -> None:
        samples: dict[str, list] = {name: [] for name in engines}
        for _ in range(REPEATS):
            for name, engine in engines.items():
                samples[name].append(measure(engine))
        for name in engines:
            results[name][metric] = summarize(samples[name])

    for length in PREFILL_LENGTHS:
        alternate(f"prefill tok/s @{length // 1024}k",
                  lambda engine: _time_request(engine, _random_prompt(rng, length, vocab_size), 1)[0],
                  lambda seconds: length / _median(seconds))

    def cached_ratio(engine: LLMEngine) -> float:
        prefix = _random_prompt(rng, 2048, vocab_size)
        cold_ttft, _ = _time_request(engine, prefix + _random_prompt(rng, 32, vocab_size), 1)
        warm_ttft, _ = _time_request(engine, prefix + _random_prompt(rng, 32, vocab_size), 1)
        return warm_ttft / cold_ttft

    alternate("cached-2k TTFT / cold", cached_ratio, _median)

    def decode_seconds(engine: LLMEngine) -> float:
        first, total = _time_request(engine, _random_prompt(rng, 32, vocab_size), DECODE_TOKENS + 1)
        return total - first

    alternate("decode tok/s @1", decode_seconds, lambda seconds: DECODE_TOKENS / _median(seconds))
    alternate("decode tok/s @16", lambda engine: _aggregate_decode(engine, rng, vocab_size), _median)
    return results


def _aggregate_decode(engine: LLMEngine, rng: random.Random, vocab_size: int) -> float:
    params = SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0.0, ignore_eos=True)
    requests = [engine.add_request(f"agg-{i}-{time.perf_counter_ns()}", _random_prompt(rng, 32, vocab_size), params)
                for i in range(NUM_CONCURRENT)]
    while not all(r.output_token_ids for r in requests):  # all prefills done
        engine.step()
    started = time.perf_counter()
    produced_before = sum(len(r.output_token_ids) for r in requests)
    while engine.has_unfinished():
        engine.step()
    produced = sum(len(r.output_token_ids) for r in requests) - produced_before
    return produced / (time.perf_counter() - started)


def bench_transformers(model_dir: Path, dtype: str, vocab_size: int, device: str) -> dict[str, float]:
    import transformers

    rng = random.Random(0)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).eval().to(device)
    results: dict[str, float] = {}

    def generate(ids: torch.Tensor, new_tokens: int) -> float:
        ids = ids.to(device)
        started = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - started

    generate(torch.tensor([_random_prompt(rng, 64, vocab_size)]), 2)  # warm-up
    for length in PREFILL_LENGTHS:
        seconds = _median(generate(torch.tensor([_random_prompt(rng, length, vocab_size)]), 1) for _ in range(REPEATS))
        results[f"prefill tok/s @{length // 1024}k"] = length / seconds
    results["cached-2k TTFT / cold"] = float("nan")  # no prefix cache across generate calls
    prompt = torch.tensor([_random_prompt(rng, 32, vocab_size)])
    one = _median(generate(prompt, 1) for _ in range(REPEATS))
    results["decode tok/s @1"] = DECODE_TOKENS / (_median(generate(prompt, DECODE_TOKENS + 1)
                                                          for _ in range(REPEATS)) - one)
    batch = torch.tensor([_random_prompt(rng, 32, vocab_size) for _ in range(NUM_CONCURRENT)])
    one = generate(batch, 1)
    results["decode tok/s @16"] = NUM_CONCURRENT * DECODE_TOKENS / (generate(batch, DECODE_TOKENS + 1) - one)
    return results


def bench_rss(model_dir: Path, vocab_size: int, num_requests: int = 1000) -> tuple[int, int]:
    """RSS after the first 10 and after `num_requests` mixed requests (shared
    prefixes, mixed lengths, 16 in flight at a time)."""
    rng = random.Random(1)
    engine = LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=1 << 30))
    system_prompts = [_random_prompt(rng, rng.randrange(64, 400), vocab_size) for _ in range(8)]
    rss_after_10 = 0
    done = 0
    from tqdm import tqdm

    with tqdm(total=num_requests, desc="rss: mixed requests", unit="req") as progress:
        while done < num_requests:
            batch = min(16, num_requests - done)
            for i in range(batch):
                prompt = rng.choice(system_prompts) + _random_prompt(rng, rng.randrange(8, 200), vocab_size)
                params = SamplingParams(max_tokens=rng.randrange(1, 12), temperature=rng.choice([0.0, 0.8]),
                                        seed=rng.randrange(1 << 30), ignore_eos=True)
                engine.add_request(f"rss-{done + i}", prompt, params)
            while engine.has_unfinished():
                engine.step()
            done += batch
            progress.update(batch)
            if rss_after_10 == 0 and done >= 10:
                gc.collect()
                rss_after_10 = _rss_bytes()
    gc.collect()
    return rss_after_10, _rss_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--only-rss", action="store_true", help="only the RSS check")
    parser.add_argument("--rss-requests", type=int, default=1000)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    model_dir = pull(args.model)
    print(f"model {model_dir}, device {args.device}, torch {torch.__version__}", flush=True)
    from model.config import ModelConfig

    vocab_size = ModelConfig.from_model_dir(model_dir).vocab_size
    columns: dict[str, dict[str, float]] = {}
    for dtype in [] if args.only_rss else args.dtypes.split(","):
        variants = {f"radixserve {dtype}": {}}
        if dtype == "float32" and args.device == "cpu" and (model_dir / BLOCKS_FILE).is_file():
            variants[f"radixserve {dtype} --no-gguf-blocks"] = {"gguf_blocks": False}
        print(f"radixserve {dtype}: {', '.join(variants)}, alternated ...", flush=True)
        columns.update(bench_radixserve(model_dir, dtype, vocab_size, args.device, variants))
        gc.collect()
        if not args.skip_hf:
            print(f"transformers {dtype} ...", flush=True)
            columns[f"HF {dtype}"] = bench_transformers(model_dir, dtype, vocab_size, args.device)
            gc.collect()
    names = list(columns)
    rows = next(iter(columns.values())).keys() if columns else []
    if columns:
        print()
        print("| metric | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
    for row in rows:
        print(f"| {row} | " + " | ".join(f"{columns[n][row]:.3f}" if "/" in row and "tok/s" not in row
                                         else f"{columns[n][row]:.1f}" for n in names) + " |")
    if not args.skip_rss:
        rss_10, rss_end = bench_rss(model_dir, vocab_size, args.rss_requests)
        print(f"\nRSS after 10 requests: {rss_10 / 2**20:.1f} MiB; after {args.rss_requests}: "
              f"{rss_end / 2**20:.1f} MiB ({100 * (rss_end / rss_10 - 1):+.2f}%)")


if __name__ == "__main__":
    main()

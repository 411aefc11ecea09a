"""What quantized KV pages (--kv-dtype) buy a prefix cache: the same bytes, more cached prefixes.

    nice .venv/bin/python -m bench.kv_dtype_capacity [--sessions 8] [--turns 5] [--kv-dtypes float32,bfloat16,int8]

In-process, bench/kv_tier_bench.py's pressure workload: agent sessions (each its own context, growing
every turn by the answer and a tool result), served round robin one request at a time, so the least
recently used session is the next one. One engine per KV dtype, each with a pool of a quarter of the
sessions' working set in float32 bytes (no disk tier), plus a float32 pool big enough for everything,
run on the very same requests interleaved. Reported per engine: its pool's token capacity, the cached
share of prompt tokens and TTFT p50 (the issue's target: int8 >= 1.8x float32's cached share, or the
big pool's share).
"""

import argparse
import random
import statistics
import sys

from bench.kv_tier_bench import (ANSWER_TOKENS, PAGE_SIZE, SESSION_PROMPT_TOKENS, TOOL_RESULT_TOKENS, _run,
                                 _tokens, _warm_up)
from engine.engine_config import EngineConfig
from engine.kv_dtype_config import KVDtypeConfig
from engine.llm_engine import LLMEngine
from kernels.cpu_features import this_cpu
from store.model_store import DEFAULT_MODEL, pull


def _engine(model_dir, num_pool_bytes: int, kv_dtype: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", page_size=PAGE_SIZE,
                                  kv_cache_bytes=num_pool_bytes, max_num_batched_tokens=2048,
                                  kv_dtype=KVDtypeConfig(kv_dtype)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--kv-dtypes", default="float32,bfloat16,int8")
    args = parser.parse_args()
    model_dir = pull(args.model)
    rng = random.Random(2)
    final_session_tokens = SESSION_PROMPT_TOKENS + args.turns * (ANSWER_TOKENS + TOOL_RESULT_TOKENS)
    working_set_pages = args.sessions * -(-final_session_tokens // PAGE_SIZE)
    big = _engine(model_dir, 64 << 20, "float32")  # resized below: its page bytes are float32's
    float32_page_bytes = big.kv_pool.shape.bytes_per_page
    big.close()
    small_pool_bytes = working_set_pages // 4 * float32_page_bytes
    engines = {f"{kv_dtype}, pool 1/4": _engine(model_dir, small_pool_bytes, kv_dtype)
               for kv_dtype in args.kv_dtypes.split(",")}
    engines["float32, pool for all"] = _engine(model_dir, 2 * working_set_pages * float32_page_bytes, "float32")
    vocab_size = next(iter(engines.values())).vocab_size
    print(f"cpu: {this_cpu()}; {args.sessions} sessions x {args.turns} turns, working set {working_set_pages} "
          f"pages ({working_set_pages * PAGE_SIZE} tokens), small pools {small_pool_bytes / 2**20:.1f} MiB",
          file=sys.stderr, flush=True)
    for engine in engines.values():
        _warm_up(engine, rng, vocab_size)
    ttfts = {name: [] for name in engines}
    cached = {name: 0 for name in engines}
    prompt_total = 0
    contexts = [_tokens(rng, SESSION_PROMPT_TOKENS, vocab_size) for _ in range(args.sessions)]
    for turn in range(args.turns):
        for session in range(args.sessions):
            prompt = contexts[session]
            outputs = {}
            for name, engine in engines.items():  # interleaved: the same request on each, back to back
                ttft, output, num_cached = _run(engine, prompt, ANSWER_TOKENS)
                ttfts[name].append(ttft)
                cached[name] += num_cached
                outputs[name] = output
            prompt_total += len(prompt)
            contexts[session] = prompt + outputs["float32, pool for all"] + _tokens(rng, TOOL_RESULT_TOKENS,
                                                                                     vocab_size)
        print(f"  turn {turn} done", file=sys.stderr, flush=True)
    base = cached[next(iter(engines))] / prompt_total
    print(f"{args.sessions} sessions x {args.turns} turns, {prompt_total} prompt tokens; pools of "
          f"{small_pool_bytes / 2**20:.1f} MiB (a quarter of the float32 working set) unless said:")
    print(f"  {'':24s} {'capacity tokens':>15s} {'cached share':>12s} {'vs first':>9s} {'TTFT p50 s':>11s}")
    for name, engine in engines.items():
        share = cached[name] / prompt_total
        ratio = f"{share / base:8.2f}x" if base else f"{'n/a':>9s}"  # the first pool cached nothing
        print(f"  {name:24s} {engine.kv_pool.num_pages * PAGE_SIZE:15d} {share:12.3f} "
              f"{ratio} {statistics.median(ttfts[name]):11.3f}")
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The KV disk tier in-process (no HTTP): what a restart costs, and what a pool too small costs.

    .venv/bin/python -m bench.kv_tier_bench [--model NAME|PATH] [--repeats 2] [--sessions 8] [--turns 4]

(1) restart: a request with a 2k-token system prompt (+ a 32-token question) on a fresh engine,
    then the engine is closed and a new one started on the same tier directory, and the same
    system prompt comes with another question. Reported: its TTFT as a fraction of the cold TTFT
    (the target is <= 0.1), beside a hit in the pool of the same engine. The tier's files were
    just written, so they are read from the OS page cache, as after a process restart (not after a
    reboot).
(2) pressure: agent sessions (each its own context, growing every turn by the answer and a tool
    result), served round robin, one request at a time, so the least recently used session is the
    next one: the worst case for a pool that cannot hold them all. Three engines run the very same
    requests interleaved: a pool 1/4 of the sessions' working set without a tier, the same pool with
    the disk tier, and a pool big enough for everything. Reported: cached share of prompt tokens
    and TTFT p50 (the target: the tier keeps >= 90% of the big pool's cached share).
"""

import argparse
import gc
import random
import shutil
import statistics
import tempfile
from pathlib import Path

from bench.engine_bench import run_alone
from engine.engine_config import EngineConfig
from engine.kv_disk_config import KVDiskConfig
from engine.llm_engine import LLMEngine
from store.model_store import DEFAULT_MODEL, pull

SYSTEM_PROMPT_TOKENS = 2048
QUESTION_TOKENS = 32
# Small enough for a few minutes on 2 shared cores (prefill runs at ~100-300 tokens/s there).
SESSION_PROMPT_TOKENS = 256  # each agent session's own context at its first turn
TOOL_RESULT_TOKENS = 32  # added to a session's context each turn, after the answer
ANSWER_TOKENS = 4
PAGE_SIZE = 16


def _tokens(rng: random.Random, num_tokens: int, vocab_size: int) -> list[int]:
    return [rng.randrange(100, vocab_size) for _ in range(num_tokens)]


def _engine(model_dir: Path, num_pool_bytes: int, kv_disk_dir: Path | None, policy: str = "write-through"):
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", page_size=PAGE_SIZE,
                                  kv_cache_bytes=num_pool_bytes, max_num_batched_tokens=2048,
                                  kv_disk=KVDiskConfig(directory=kv_disk_dir, policy=policy, max_bytes=8 << 30)))


def _run(engine: LLMEngine, prompt: list[int], max_tokens: int) -> tuple[float, list[int], int]:
    """(TTFT seconds, output ids, cached prompt tokens) of one request alone."""
    ttft, _, request = run_alone(engine, prompt, max_tokens)
    return ttft, list(request.output_token_ids), request.num_cached_tokens


def _warm_up(engine: LLMEngine, rng: random.Random, vocab_size: int) -> None:
    """Runs the shapes the timed requests use, so no timing pays for a first use: oneDNN builds its
    GEMM primitives once per token count, and a prefill over cached pages takes its own path."""
    prefix = _tokens(rng, 4 * PAGE_SIZE, vocab_size)
    for _ in range(2):
        _run(engine, prefix + _tokens(rng, QUESTION_TOKENS, vocab_size), 1)


def bench_restart(model_dir: Path, vocab_size: int, tier_root: Path, repeats: int) -> dict[str, float]:
    rng = random.Random(1)
    # cold: the first engine's (its tier writing the pages meanwhile); no tier: an engine without one
    cold_ttfts, no_tier_ttfts, restart_ttfts, pool_ttfts, restart_cached, load_seconds = [], [], [], [], [], []
    same_output = True
    for repeat in range(repeats):
        system_prompt = _tokens(rng, SYSTEM_PROMPT_TOKENS, vocab_size)
        first = _engine(model_dir, 1 << 30, tier_root)
        _warm_up(first, rng, vocab_size)
        cold_ttft, cold_output, _ = _run(first, system_prompt + _tokens(rng, QUESTION_TOKENS, vocab_size), 1)
        pool_ttft, _, _ = _run(first, system_prompt + _tokens(rng, QUESTION_TOKENS, vocab_size), 1)
        first.close()
        del first
        gc.collect()
        again = _engine(model_dir, 1 << 30, tier_root)
        _warm_up(again, rng, vocab_size)  # other tokens: no tier hit
        restart_ttft, _, num_cached = _run(again, system_prompt + _tokens(rng, QUESTION_TOKENS, vocab_size), 1)
        load_seconds.append(again.metrics.kv_disk_load.total_seconds)  # reading and checking the pages
        # Greedy output after a restart equals the cold one's for the same prompt.
        cold_prompt_output = _run(again, system_prompt + [7] * QUESTION_TOKENS, 4)[1]
        again.close()
        del again
        gc.collect()
        cold_engine = _engine(model_dir, 1 << 30, None)
        _warm_up(cold_engine, rng, vocab_size)
        no_tier_ttft, no_tier_output, _ = _run(cold_engine, system_prompt + [7] * QUESTION_TOKENS, 4)
        same_output &= cold_prompt_output == no_tier_output
        del cold_engine
        gc.collect()
        cold_ttfts.append(cold_ttft)
        no_tier_ttfts.append(no_tier_ttft)
        restart_ttfts.append(restart_ttft)
        pool_ttfts.append(pool_ttft)
        restart_cached.append(num_cached)
        print(f"  restart repeat {repeat}: cold {cold_ttft:.3f}s (no tier: {no_tier_ttft:.3f}s), after restart "
              f"{restart_ttft:.3f}s ({num_cached} cached, {load_seconds[-1]:.3f}s of it loading pages), "
              f"pool hit {pool_ttft:.3f}s", flush=True)
    cold = statistics.median(cold_ttfts)
    return {
        "cold 2k TTFT s": cold,
        "cold TTFT no tier / tier": statistics.median(no_tier_ttfts) / cold,
        "restart TTFT / cold": statistics.median(restart_ttfts) / cold,
        "restart TTFT / no-tier cold": statistics.median(restart_ttfts) / statistics.median(no_tier_ttfts),
        "pool-hit TTFT / cold": statistics.median(pool_ttfts) / cold,
        "page loads s (2k tokens)": statistics.median(load_seconds),
        "restart cached tokens": min(restart_cached),
        "restart output == cold": float(same_output),
    }


def bench_pressure(model_dir: Path, vocab_size: int, tier_root: Path, num_sessions: int,
                   num_turns: int, bytes_per_page: int) -> dict[str, dict[str, float]]:
    rng = random.Random(2)
    final_session_tokens = SESSION_PROMPT_TOKENS + num_turns * (ANSWER_TOKENS + TOOL_RESULT_TOKENS)
    working_set_pages = num_sessions * -(-final_session_tokens // PAGE_SIZE)
    small_pool_bytes = working_set_pages // 4 * bytes_per_page
    engines = {
        "pool 1/4, no tier": _engine(model_dir, small_pool_bytes, None),
        "pool 1/4 + disk tier": _engine(model_dir, small_pool_bytes, tier_root),
        "pool for all": _engine(model_dir, 2 * working_set_pages * bytes_per_page, None),
    }
    print(f"  pressure: {num_sessions} sessions x {num_turns} turns, working set {working_set_pages} pages, "
          f"small pool {small_pool_bytes // bytes_per_page} pages", flush=True)
    for engine in engines.values():
        _warm_up(engine, rng, vocab_size)
    ttfts = {name: [] for name in engines}
    cached = {name: 0 for name in engines}
    prompt_total = 0
    num_differing = {name: 0 for name in engines}  # greedy answers unlike the big pool's (KV summed in another order)
    contexts = [_tokens(rng, SESSION_PROMPT_TOKENS, vocab_size) for _ in range(num_sessions)]
    for turn in range(num_turns):
        for session in range(num_sessions):
            prompt = contexts[session]
            outputs = {}
            for name, engine in engines.items():  # interleaved: the same request on each, back to back
                ttft, output, num_cached = _run(engine, prompt, ANSWER_TOKENS)
                ttfts[name].append(ttft)
                cached[name] += num_cached
                outputs[name] = output
            prompt_total += len(prompt)
            for name, output in outputs.items():
                num_differing[name] += output != outputs["pool for all"]
            contexts[session] = prompt + outputs["pool for all"] + _tokens(rng, TOOL_RESULT_TOKENS, vocab_size)
        print(f"  pressure turn {turn} done", flush=True)
    results = {}
    for name, engine in engines.items():
        stats = engine.stats()
        results[name] = {"cached share": cached[name] / prompt_total,
                         "TTFT p50 s": statistics.median(ttfts[name]),
                         "disk hit tokens": stats.kv_disk.num_hit_tokens,
                         "disk pages": stats.kv_disk.num_pages,
                         "num differing answers": num_differing[name]}
        engine.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--repeats", type=int, default=2, help="restarts measured (default: 2)")
    parser.add_argument("--sessions", type=int, default=6, help="agent sessions (default: 6)")
    parser.add_argument("--turns", type=int, default=3, help="turns per session (default: 3)")
    parser.add_argument("--skip-restart", action="store_true")
    parser.add_argument("--skip-pressure", action="store_true")
    args = parser.parse_args()
    model_dir = pull(args.model, progress=True)
    probe = _engine(model_dir, 64 << 20, None)
    vocab_size, bytes_per_page = probe.vocab_size, probe.kv_pool.shape.bytes_per_page
    del probe
    gc.collect()
    tier_root = Path(tempfile.mkdtemp(prefix="kv-tier-bench-"))
    try:
        if not args.skip_restart:
            print("restart:", flush=True)
            for name, value in bench_restart(model_dir, vocab_size, tier_root / "restart", args.repeats).items():
                print(f"  {name:28s} {value:10.3f}")
        if not args.skip_pressure:
            results = bench_pressure(model_dir, vocab_size, tier_root / "pressure", args.sessions, args.turns,
                                     bytes_per_page)
            print(f"  {'':24s} {'cached share':>12s} {'TTFT p50 s':>11s} {'disk hits':>10s} {'differing':>10s}")
            for name, row in results.items():
                print(f"  {name:24s} {row['cached share']:12.3f} {row['TTFT p50 s']:11.3f} "
                      f"{row['disk hit tokens']:10d} {row['num differing answers']:10d}")
            big = results["pool for all"]["cached share"]
            print(f"  tier keeps {results['pool 1/4 + disk tier']['cached share'] / big:.1%} of the big pool's "
                  f"cached share (no tier: {results['pool 1/4, no tier']['cached share'] / big:.1%})")
    finally:
        shutil.rmtree(tier_root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Cold prefill in process, prefill attention on the C kernel over pages against torch's SDPA, in one run.

    nice .venv/bin/python -m bench.prefill_attention_bench [--model smollm2-135m-instruct]
        [--lengths 1024,4096] [--repeats 3] [--paths c,c-float32,sdpa] [--kv-dtype float32] [--threads N]
    nice .venv/bin/python -m bench.prefill_attention_bench --layer [--kv-dtype float32] [--threads 1]

One engine per path (EngineConfig.prefill_attention: "c" is "auto", the C kernel, kernels/cpu_prefill_attention.py,
in bf16 on AMX where prefill's GEMMs run bf16 products; "c-float32" its float32 builds; "sdpa" torch's SDPA over
gathered K/V, the path before it), otherwise the defaults (prefill's dtype "auto", the backend's step budget: 512-token chunks, each attending to the part before it as its cached prefix), prefix
cache off so every prefill is cold. Per length L: a prompt of L random token ids through
`LLMEngine.prompt_tail_logits(prompt, 1)` (the ordinary scheduled path; one output position), wall time,
the paths interleaved within each repeat (after a 64-token warm-up each), the median of `--repeats`; and the
time inside the backend's attention calls (prefill attention's share of the prefill). The last position's
logits of the paths are compared (max abs difference). Prints the CPU's instruction sets and each engine's
describe(): the numbers belong to them. Results go to docs/performance.md by hand.

`--layer`: one layer's attention alone at the default model's shape (H 9, KVH 3, D 64, pages of 16
over a 4096-token context, shuffled), for query rows 0-1024 (a cold 1k prefill in one call) and
3584-4096 (the last 512-token chunk of a 4k prefill): torch's path (kernels/paged_attention.py, SDPA
over gathered K/V in row blocks) against each build of the C kernel this CPU runs (the AMX one included), the best of
`--repeats` (at least 5) in the calling thread's CPU time (time.thread_time: other processes' load
counts less than in wall time); with `--threads` above 1 (an OpenMP team) wall time instead.
"""

import argparse
import random
import statistics
import time
from collections.abc import Sequence

import torch

from engine.engine_config import EngineConfig
from kernels import cpu_prefill_attention
from kernels.attention_inputs import AttentionInputs
from kernels.attention_plan import CPU_ATTENTION
from kernels.cpu_features import PORTABLE, VARIANTS
from engine.kv_dtype_config import KVDtypeConfig
from engine.llm_engine import LLMEngine
from kernels.cpu_features import this_cpu
from kernels.kv_format import KVPages
from kernels.native_build import NativeUnavailable
from kernels.paged_attention import paged_attention
from store.model_store import pull, radixserve_home

PATHS = {"c": "auto", "c-float32": "float32", "sdpa": "sdpa"}  # the bench's name -> EngineConfig.prefill_attention
KV_CACHE_BYTES = 512 << 20


class AttentionTimer:
    """Sums the wall time of an engine's backend.attention calls (the model looks the method up per call)."""

    def __init__(self, engine: LLMEngine):
        self.seconds = 0.0
        attention = engine.backend.attention

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return attention(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        engine.backend.attention = timed


def layer_times(kv_dtype: str, repeats: int) -> None:
    """One layer's prefill attention at the default model's shape, torch's path against each C build."""
    page_size, num_kv_heads, group, head_dim, context_len = 16, 3, 3, 64, 4096
    generator = torch.Generator().manual_seed(0)
    num_pages = context_len // page_size + 2
    caches = [KVPages.zeros(kv_dtype, (num_pages, page_size, num_kv_heads, head_dim), "cpu") for _ in range(2)]
    for cache in caches:
        cache.store(torch.arange(num_pages * page_size),
                    torch.randn(num_pages * page_size, num_kv_heads, head_dim, generator=generator))
    page_ids = torch.randperm(num_pages, generator=generator)[:context_len // page_size].tolist()
    builds = {}
    for build in (*VARIANTS, PORTABLE):
        if build == PORTABLE or this_cpu().has(*VARIANTS[build][0]):
            try:
                builds[build] = cpu_prefill_attention.load(radixserve_home() / "kernels", variant=build,
                                                           portable=build == PORTABLE)
            except NativeUnavailable as error:
                print(f"{build}: {error}")
    try:
        builds[cpu_prefill_attention.AMX_BF16] = cpu_prefill_attention.load_amx(radixserve_home() / "kernels")
    except NativeUnavailable as error:
        print(f"{cpu_prefill_attention.AMX_BF16}: {error}")
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter

    def best(fn) -> float:
        times = []
        for _ in range(max(repeats, 5)):
            started = clock()
            fn()
            times.append(clock() - started)
        return min(times)

    for start, end in ((0, 1024), (3584, 4096)):
        inputs = AttentionInputs.for_chunks([(page_ids, start, end)], page_size, "cpu")
        q = torch.randn(end - start, num_kv_heads * group, head_dim, generator=generator)
        out = torch.empty_like(q)
        index = (inputs.page_table.contiguous(), torch.tensor(inputs.query_starts[:-1]),
                 torch.tensor(inputs.query_lens), torch.tensor(inputs.context_lens))
        # (row, key) pairs seen x heads x 4 D flops (scores and P V, a multiply-add counted as 2)
        flops = sum(start + i + 1 for i in range(end - start)) * num_kv_heads * group * 4 * head_dim
        seconds = {"torch": best(lambda: paged_attention(q, *caches, inputs, 0.125, CPU_ATTENTION))}
        for build, kernel in builds.items():
            seconds[build] = best(lambda: kernel.paged_prefill_attention(q, *caches, *index, 0.125, out))
        print(f"rows {start}-{end} of {context_len}, {kv_dtype} KV: " + ", ".join(
            f"{name} {1e3 * value:.1f} ms ({flops / value / 1e9:.0f} GFLOP/s)" for name, value in seconds.items()),
            flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", default="c,sdpa", help=f"of {', '.join(PATHS)}, comma-separated")
    parser.add_argument("--kv-dtype", default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: torch's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layer", action="store_true", help="one layer's attention alone, each C build and torch's")
    args = parser.parse_args(argv)
    paths = [path for path in args.paths.split(",") if path]
    if not paths or any(path not in PATHS for path in paths):
        parser.error(f"--paths takes {', '.join(PATHS)}, comma-separated, got {args.paths!r}")
    lengths = [int(length) for length in args.lengths.split(",") if length]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"cpu: {this_cpu().describe()}; torch threads {torch.get_num_threads()}", flush=True)
    if args.layer:
        layer_times(args.kv_dtype, args.repeats)
        return 0
    model_dir = pull(args.model)
    engines, timers = {}, {}
    for path in paths:
        engines[path] = LLMEngine(EngineConfig(
            model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=KV_CACHE_BYTES,
            max_model_len=max(lengths) + 64, enable_prefix_cache=False, prefill_attention=PATHS[path],
            kv_dtype=KVDtypeConfig(kv_dtype=args.kv_dtype)))
        timers[path] = AttentionTimer(engines[path])
        print(f"{path}: {engines[path].backend.describe()}", flush=True)
    rng = random.Random(args.seed)
    vocab_size = engines[paths[0]].vocab_size
    warm_up = [rng.randrange(vocab_size) for _ in range(64)]
    for engine in engines.values():
        engine.prompt_tail_logits(warm_up, 1)
    for length in lengths:
        prompt = [rng.randrange(vocab_size) for _ in range(length)]
        seconds = {path: [] for path in paths}
        attention = {path: [] for path in paths}
        logits = {}
        for _ in range(args.repeats):
            for path in paths:
                timers[path].seconds = 0.0
                started = time.perf_counter()
                logits[path] = engines[path].prompt_tail_logits(prompt, 1)
                seconds[path].append(time.perf_counter() - started)
                attention[path].append(timers[path].seconds)
        for path in paths:
            wall, inside = statistics.median(seconds[path]), statistics.median(attention[path])
            print(f"L={length} {path}: {length / wall:.1f} tok/s (median of {args.repeats}: {wall:.2f} s; "
                  f"all {', '.join(f'{s:.2f}' for s in seconds[path])}), attention {inside:.2f} s = "
                  f"{100 * inside / wall:.0f}%", flush=True)
        if len(paths) > 1:
            first = paths[0]
            for path in paths[1:]:
                ratio = statistics.median(seconds[path]) / statistics.median(seconds[first])
                difference = (logits[first] - logits[path]).abs().max().item()
                print(f"L={length} {first} over {path}: {ratio:.2f}x faster; last logits max |diff| {difference:.2e}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

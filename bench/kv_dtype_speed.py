"""Decode (and cold prefill) speed over quantized KV pages (--kv-dtype) against float32 KV, side by side in one run.

    nice .venv/bin/python -m bench.kv_dtype_speed [--context 4096] [--batches 1,8] [--kv-dtypes float32,bfloat16,int8]
        [--tokens 32] [--rounds 3] [--attention-only [--layers 30] [--prefix shared|own]] [--rerotate-only]

In-process, one engine per KV dtype on the default model (cpu backend as served, prefix cache on),
all alive at once. Each sequence of a batch is a shared prefix of `context` - 64 random tokens (prefilled once per
engine, then cached) plus 64 tokens of its own, so every sequence attends over `context` positions;
then `tokens` greedy tokens each (ignore_eos). Decode tokens/s: tokens after each request's first over
the wall time from the step after the last first token to the end. Rounds alternate the dtypes
(the machine is noisy); the best round of each is reported, with the ratio to float32. Prints the
CPU's instruction sets and the backend's plan: the numbers belong to them. Each round also prefills a
prompt of `context` fresh random tokens (cold: nothing of it cached) once per dtype: prefill tokens/s.

--attention-only: the C decode attention kernel alone (kernels/csrc/decode_attention.c) over pages of
each dtype in the default model's shapes (9 query heads, 3 KV heads of 64), every sequence at `context`
positions, `layers` layers' pages (default 30, the default model's: a step's KV does not stay in the CPU's
caches, as in real decode; --layers 1 times one layer's pages, which do), one step (a call per layer)
timed, best of `rounds` x 5 steps, the dtypes interleaved, on torch's thread count. --prefix shared (the
default) lays the pages out as the end-to-end run does: the batch's sequences share the pages of the first
`context` - 64 positions and each has 64 positions on pages of its own; --prefix own gives every sequence
all its pages to itself (no reading shared by the batch).

--rerotate-only: document reuse's placing of a stored span (C rerotate_store_kv: K rotated by a position
delta, K and V stored; int8: dequantized before, quantized again on store), a 512-token span of one
layer, best of `rounds` x 50 calls, per dtype.
"""

import argparse
import random
import sys
import time
from collections.abc import Sequence

import torch

from engine.engine_config import EngineConfig
from engine.kv_dtype_config import KVDtypeConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from kernels import cpu_decode_ops
from kernels.cpu_features import this_cpu
from kernels.kv_format import KVPages
from kernels.rotary import rerotation_cos_sin
from store.model_store import radixserve_home
from store.model_store import pull

OWN_TOKENS = 64  # each sequence's tokens after the shared prefix


def _engine(model_dir, kv_dtype: str, num_tokens: int) -> LLMEngine:
    # float32 bytes a token of SmolLM2-135M: 30 layers x 3 KV heads x 64 x 4 x 2 = 46080; every dtype the same bytes
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32",
                                  kv_cache_bytes=num_tokens * 46080, kv_dtype=KVDtypeConfig(kv_dtype)))


def prefill_rate(engine: LLMEngine, num_tokens: int, rng: random.Random) -> float:
    """Tokens/s of one cold prefill of `num_tokens` random tokens (and its first token)."""
    prompt = [rng.randrange(3, engine.vocab_size) for _ in range(num_tokens)]
    started = time.perf_counter()
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    return num_tokens / (time.perf_counter() - started)


def decode_rate(engine: LLMEngine, prefix: list[int], batch: int, num_tokens: int, rng: random.Random) -> float:
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    vocab = engine.vocab_size
    requests = [engine.add_request(f"r{engine.num_steps}-{i}-{rng.random()}",
                                   prefix + [rng.randrange(3, vocab) for _ in range(OWN_TOKENS)], params)
                for i in range(batch)]
    while not all(r.output_token_ids for r in requests):
        engine.step()
    done_before = sum(len(r.output_token_ids) for r in requests)
    started = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    seconds = time.perf_counter() - started
    return (sum(len(r.output_token_ids) for r in requests) - done_before) / seconds


def attention_seconds(kv_dtypes: list[str], batches: list[int], context: int, rounds: int, layers: int,
                      shared_prefix: bool = True) -> dict:
    """(kv_dtype, batch) -> best seconds of one step's decode attention (a call per layer) over `batch`
    sequences; with `shared_prefix` their first `context` - OWN_TOKENS positions are on the same pages."""
    ops = cpu_decode_ops.load(radixserve_home() / "kernels")
    heads, kv_heads, head_dim, page_size = 9, 3, 64, 16
    gen = torch.Generator().manual_seed(0)
    pages_per_seq = -(-context // page_size)
    shared_pages = (context - OWN_TOKENS) // page_size if shared_prefix else 0
    own_pages = pages_per_seq - shared_pages
    num_pages = shared_pages + max(batches) * own_pages
    float_pages = [torch.randn(num_pages, page_size, kv_heads, head_dim, generator=gen) for _ in range(2)]
    caches = {}  # kv_dtype -> a (K, V) pair per layer, each layer its own memory
    for kv_dtype in kv_dtypes:
        caches[kv_dtype] = []
        for _ in range(layers):
            pages = [KVPages.zeros(kv_dtype, tuple(float_pages[0].shape), "cpu") for _ in range(2)]
            for cache, values in zip(pages, float_pages):
                cache.store(torch.arange(num_pages * page_size), values.view(-1, kv_heads, head_dim))
            caches[kv_dtype].append(pages)
    best = {}
    for _ in range(rounds):
        for batch in batches:
            q = torch.randn(batch, heads, head_dim, generator=gen)
            out = torch.empty_like(q)
            page_table = torch.cat([torch.arange(shared_pages).expand(batch, shared_pages),
                                    shared_pages + torch.arange(batch * own_pages).view(batch, own_pages)], 1)
            context_lens, rows = torch.full((batch,), context), torch.arange(batch)
            for kv_dtype, layer_caches in caches.items():
                started = time.perf_counter()
                for _ in range(5):
                    for k_cache, v_cache in layer_caches:
                        ops.paged_decode_attention(q, k_cache, v_cache, page_table, context_lens, rows, 0.125, out)
                seconds = (time.perf_counter() - started) / 5
                best[kv_dtype, batch] = min(best.get((kv_dtype, batch), float("inf")), seconds)
    return best


def rerotate_seconds(kv_dtypes: list[str], rounds: int) -> dict:
    """kv_dtype -> best seconds of placing a 512-token span into one layer's pages."""
    ops = cpu_decode_ops.load(radixserve_home() / "kernels")
    span, kv_heads, head_dim = 512, 3, 64
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(span, kv_heads, head_dim, generator=gen), torch.randn(span, kv_heads, head_dim, generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    cos, sin = rerotation_cos_sin(inv_freq, 37, torch.float32)
    best = {}
    for _ in range(rounds):
        for kv_dtype in kv_dtypes:
            pages = [KVPages.zeros(kv_dtype, (span // 16, 16, kv_heads, head_dim), "cpu") for _ in range(2)]
            started = time.perf_counter()
            for _ in range(50):
                ops.rerotate_store_kv(k, v, cos, sin, *pages, torch.arange(span))
            best[kv_dtype] = min(best.get(kv_dtype, float("inf")), (time.perf_counter() - started) / 50)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--kv-dtypes", default="float32,bfloat16,int8")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attention-only", action="store_true")
    parser.add_argument("--layers", type=int, default=30, help="--attention-only: layers' pages a step reads")
    parser.add_argument("--prefix", choices=("shared", "own"), default="shared",
                        help="--attention-only: the batch's sequences share their first context - 64 positions' "
                             "pages (as end to end), or each has pages of its own")
    parser.add_argument("--rerotate-only", action="store_true")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    kv_dtypes = args.kv_dtypes.split(",")
    if args.rerotate_only:
        best = rerotate_seconds(kv_dtypes, args.rounds)
        print(f"cpu: {this_cpu()}, {torch.get_num_threads()} threads; placing a 512-token document span into one "
              f"layer (C rerotate_store_kv), best of {args.rounds} x 50 calls: " +
              ", ".join(f"{kv_dtype} {seconds * 1e6:.0f} us" for kv_dtype, seconds in best.items()))
        return 0
    if args.attention_only:
        best = attention_seconds(kv_dtypes, batches, args.context, args.rounds, args.layers, args.prefix == "shared")
        print(f"cpu: {this_cpu()}, {torch.get_num_threads()} threads; decode attention, {args.layers} layers, "
              f"{args.context} positions a sequence ({args.prefix} prefix), best of {args.rounds} x 5 steps "
              f"(microseconds a step):")
        for batch in batches:
            base = best.get(("float32", batch))
            print(f"  batch {batch}: " + ", ".join(
                f"{kv_dtype} {best[kv_dtype, batch] * 1e6:.0f}" + (f" ({base / best[kv_dtype, batch]:.2f}x speed)"
                                                                   if base else "") for kv_dtype in kv_dtypes))
        return 0
    model_dir = pull(args.model)
    rng = random.Random(0)
    num_pool_tokens = 2 * args.context + max(batches) * (OWN_TOKENS + args.tokens) + 256
    engines = {kv_dtype: _engine(model_dir, kv_dtype, num_pool_tokens) for kv_dtype in kv_dtypes}
    some = next(iter(engines.values()))
    prefix = [rng.randrange(3, some.vocab_size) for _ in range(args.context - OWN_TOKENS)]
    print(f"cpu: {this_cpu()}\n{some.backend.describe()}", file=sys.stderr)
    for engine in engines.values():  # the shared prefix, prefilled once
        engine.generate([prefix], SamplingParams(max_tokens=1, temperature=0.0))
    best: dict[tuple[str, int], float] = {}
    best_prefill: dict[str, float] = {}
    for _ in range(args.rounds):
        for kv_dtype, engine in engines.items():
            best_prefill[kv_dtype] = max(best_prefill.get(kv_dtype, 0.0), prefill_rate(engine, args.context, rng))
        for batch in batches:
            for kv_dtype, engine in engines.items():
                rate = decode_rate(engine, prefix, batch, args.tokens, rng)
                best[kv_dtype, batch] = max(best.get((kv_dtype, batch), 0.0), rate)
    base = best_prefill.get("float32")
    print(f"cold prefill tokens/s of {args.context} tokens, best of {args.rounds}: " + ", ".join(
        f"{kv_dtype} {rate:.1f}" + (f" ({rate / base:.2f}x)" if base else "") for kv_dtype, rate in best_prefill.items()))
    print(f"decode tokens/s at {args.context} context, best of {args.rounds} rounds, {args.tokens} tokens a sequence:")
    for batch in batches:
        base = best.get(("float32", batch))
        cells = [f"{kv_dtype} {best[kv_dtype, batch]:.1f}" + (f" ({best[kv_dtype, batch] / base:.2f}x)" if base else "")
                 for kv_dtype in kv_dtypes]
        print(f"  batch {batch}: " + ", ".join(cells))
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

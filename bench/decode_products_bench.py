"""Batch-1 decode products over a model's GGUF blocks against the machine's copy bandwidth, per weight,
float32 and int16 activations side by side in one run (kernels/block_matmul.py).

    nice .venv/bin/python -m bench.decode_products_bench [--type Q4_K_M] [--shape llama-3.2-1b] [--model NAME|PATH]
        [--repeats 20] [--threads N] [--cpu-time] [--int16-builds avx512_vnni,avx2,portable]

Loads the model (--model, else bench/random_gguf.py's random --shape model as --type, made once) (the engine thread's rule: load and time on the same thread), then for the
block parts of layer 1's projections and the LM head times `matmul` (float32 activations) and
`matmul_q16` (int16) on one row of x, and "int16 copy" (what int16 decode runs: the part's copy in interleaved
rows where its format has one, model/backends/decode_copies.py), alternating, best of --repeats; GB/s is the weight's block bytes
over that time. The step line adds them up as a decode step reads them (every layer as layer 1, the
head once). --cpu-time: one thread's CPU time (`time.thread_time`, one thread), which a loaded
machine does not inflate; otherwise wall time on --threads threads (default torch's). Copy bandwidth:
a 256 MiB tensor copied, read + write bytes over the best time. --int16-builds: `matmul_q16` of each
named build of the block kernels too (one column each, alternating with the others; a build this CPU
lacks is an error), e.g. the AVX-512 build's 512-bit rows against the AVX2 build's. About a minute on
a quiet machine.
"""

import argparse
import sys
import time
from collections.abc import Sequence

import torch

from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from bench.random_gguf import SHAPES, random_gguf
from kernels import block_matmul
from kernels import cpu_gemm_q8
from model.backends.cpu_linear import BlockLinear
from model.backends.decode_copies import DecodeCopies
from store.model_store import pull, radixserve_home

COPY_BYTES = 256 << 20


def copy_bandwidth(repeats: int) -> float:
    """GB/s of a large tensor copy, read + write bytes."""
    source = torch.ones(COPY_BYTES // 4)
    target = torch.empty_like(source)
    best = min(_timed(lambda: target.copy_(source), time.perf_counter) for _ in range(max(3, repeats // 4)))
    return 2 * COPY_BYTES / best / 1e9


def _timed(run, clock) -> float:
    started = clock()
    run()
    return clock() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model name or path (default: the random --shape model as --type)")
    parser.add_argument("--shape", default="llama-3.2-1b", choices=SHAPES)
    parser.add_argument("--type", default="Q4_K_M", help="the random model's GGUF type (llama-quantize's name)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--cpu-time", action="store_true", help="one thread's CPU time instead of wall time")
    parser.add_argument("--int16-builds", default="",
                        help="comma-separated block-kernel builds whose int16 products get a column each")
    args = parser.parse_args(argv)
    if args.cpu_time:
        torch.set_num_threads(1)
    elif args.threads:
        torch.set_num_threads(args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    model = args.model or str(random_gguf(args.shape, args.type))
    # float32 decode: no copies in interleaved rows, so every part keeps the blocks these kernels read (with int16
    # decode and the FMA GEMM, an AVX2 machine releases the blocks of the parts it copies)
    engine = LLMEngine(EngineConfig(model_dir=pull(model), device="cpu", dtype="float32",
                                    kv_cache_bytes=16 << 20, decode_activations="float32"))
    kernels = engine.backend.block_kernels
    if kernels is None:
        print("no block kernels on this machine (see the backend's fallbacks)", file=sys.stderr)
        return 1
    linears = {name: m for name, m in engine.model.named_modules() if isinstance(m, BlockLinear)}
    measured = [n for n in linears if n.startswith("layers.1.")] + [n for n in linears if n.endswith("lm_head")]
    num_layers = engine.model.config.num_layers
    print(f"{engine.backend.instruction_sets}; {torch.get_num_threads()} thread(s), "
          f"{'CPU time of one thread' if args.cpu_time else 'wall time'}, best of {args.repeats}; "
          f"copy bandwidth {copy_bandwidth(args.repeats):.1f} GB/s (read + write)")
    products = {"float32": kernels.matmul, "int16": kernels.matmul_q16}
    for build in filter(None, args.int16_builds.split(",")):
        products[f"int16 {build}"] = block_matmul.load(radixserve_home() / "kernels", variant=build).matmul_q16
    if kernels.instruction_set != "portable":  # what int16 decode runs: a part's copy in interleaved rows, if it has one
        copies = DecodeCopies(cpu_gemm_q8.load(radixserve_home() / "kernels", variant=kernels.instruction_set))
        for name in measured:
            copies.add(copies.kernels, [p for p in linears[name].parts if p.format in copies.kernels.q16_formats])

        def over_copy(x, part):
            y = copies.product(x, part, None)
            return kernels.matmul_q16(x, part) if y is None else y

        products["int16 copy"] = over_copy
    print(f"default build: {kernels.instruction_set}")
    print(f"{'weight':32s} {'format':6s} {'shape':>13s}" + "".join(f" {kind + ' ms':>20s} {'GB/s':>5s}" for kind in products))
    step = dict.fromkeys(products, 0.0)
    for name in measured:
        for part in linears[name].parts:
            x = torch.randn(1, part.cols)
            best = dict.fromkeys(products, float("inf"))
            for product in products.values():
                product(x, part)  # warm
            for _ in range(args.repeats):
                for kind, product in products.items():
                    best[kind] = min(best[kind], _timed(lambda: product(x, part), clock))
            for kind in step:
                step[kind] += best[kind] * (1 if name.endswith("lm_head") else num_layers)
            size = part.blocks.numel() / 1e9
            print(f"{name:32s} {part.format:6s} {part.rows:>6d}x{part.cols:<6d}"
                  + "".join(f" {best[kind] * 1e3:20.3f} {size / best[kind]:5.1f}" for kind in products))
    print(f"a step's products ({num_layers} layers as layer 1, the head once): "
          + ", ".join(f"{kind} {step[kind] * 1e3:.1f} ms" for kind in products))
    return 0


if __name__ == "__main__":
    sys.exit(main())

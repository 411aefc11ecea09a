"""Where a few-rows C kernel stops beating oneDNN's GEMM: measured per weight shape at load.

The C kernels stream a weight once for up to 8 input rows (kernels/cpu_matvec.py); oneDNN's
GEMM reads its prepacked float32 weight at a rate that grows with the rows. Which is faster
at m rows depends on the weight's shape, its format (Q4_1 nibbles cost more to decode than
Q8_0 bytes), the cores and their caches, so a constant measured on one machine was wrong on
another (docs/performance.md). `measure_crossover` times both on the real weight, interleaved,
and returns the largest row count up to which the kernel wins at every candidate; a short pass
that runs once per shape. A single best-of-5 misread a 1-row gate_up product as slower than
oneDNN on a quiet machine (EngineConfig.few_rows_crossover), so a candidate is decided by the
median over ROUNDS rounds of the per-round best-time ratio, and the kernel loses it only when
that median is over MARGIN: on a loaded machine a tie is noise, and the kernel's rows do not
depend on m, oneDNN's GEMM may.

With int8 activations (the default) weights held as blocks run one kernel for every row
count (kernels/cpu_gemm_q8.py): this measures only the float-activation kernels.

`bf16_gemm_speedup` asks the same kind of question of prefill's dtype: native bf16 is not always faster
than float32 (kernels/cpu_features.py), so prefill's "auto" dtype measures it, once a process.
"""

import functools
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

from kernels.bf16_products import bf16_products
from kernels.packed_linear import pack_weight, packed_linear

# Row counts tried; the kernel's share ends at the first one it loses.
CANDIDATE_ROWS = (1, 2, 4, 6, 8, 12, 16)
TIMED_RUNS = 5  # best of, per round; the first call of each path is a warm-up
ROUNDS = 3  # the median of the rounds' ratios decides
MARGIN = 1.1  # kernel time / oneDNN time above which the kernel loses a candidate


def measure_crossover(few_rows: Callable[[Tensor], Tensor], large: Callable[[Tensor], Tensor], in_features: int,
                      max_rows: int) -> int:
    """The largest m <= max_rows in CANDIDATE_ROWS such that few_rows(x) took at most MARGIN times
    large(x)'s time (the median of ROUNDS rounds) for every candidate up to m; 0 when it loses at one row."""
    best = 0
    generator = torch.Generator().manual_seed(0)
    for rows in (m for m in CANDIDATE_ROWS if m <= max_rows):
        x = torch.randn(rows, in_features, generator=generator)
        ratios = [few / large_seconds for few, large_seconds in
                  (_best_seconds(few_rows, large, x) for _ in range(ROUNDS))]
        if statistics.median(ratios) > MARGIN:
            break
        best = rows
    return best


@functools.cache
def bf16_gemm_speedup(rows: int = 512, size: int = 2048, rounds: int = ROUNDS) -> float:
    """float32 GEMM time over the same GEMM's with bf16 products (kernels/bf16_products.py, what bf16 prefill
    runs) on this machine: (rows, size) @ (size, size)^T, prepacked, the median of `rounds` rounds' ratio of
    the two interleaved best times (well under a second where bf16 is native)."""
    generator = torch.Generator().manual_seed(0)
    packed = pack_weight(torch.randn(size, size, generator=generator))
    x = torch.randn(rows, size, generator=generator)

    def with_bf16_products(_):
        with bf16_products():
            return packed_linear(x, packed, None)

    ratios = [float32 / bf16 for float32, bf16 in
              (_best_seconds(lambda _: packed_linear(x, packed, None), with_bf16_products, None)
               for _ in range(rounds))]
    return statistics.median(ratios)


def _best_seconds(first: Callable[[Tensor | None], Tensor], second: Callable[[Tensor | None], Tensor],
                  x: Tensor | None) -> tuple[float, float]:
    """Best wall time of each, the two called in turn so that noise hits both alike."""
    first(x), second(x)
    best_first = best_second = float("inf")
    for _ in range(TIMED_RUNS):
        started = time.perf_counter()
        first(x)
        middle = time.perf_counter()
        second(x)
        best_first, best_second = min(best_first, middle - started), min(best_second, time.perf_counter() - middle)
    return best_first, best_second

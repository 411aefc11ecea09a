"""Linear layers on oneDNN's prepacked weight layout (CPU, float32 or bfloat16).

oneDNN reorders a weight once into the blocked layout its GEMM kernels read,
instead of repacking it on every call: 1.1x faster for prefill GEMMs, 2.2x at 16
rows, 1.5x at one row (docs/performance.md).

These are private torch ops (the ones inductor's CPU freezing uses), so the
plain path stays the reference: `is_available()` says whether this path can
run, and tests compare the two.
"""

import functools
import os
import statistics
import time

import torch
from torch import Tensor

# The batch-size hint the layout is chosen for. Any M runs on the result; 256
# measured best at M = 1 and M = 1024 alike.
PACK_BATCH_HINT = 256


def is_available(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def bf16_is_available() -> bool:
    """Whether this torch's oneDNN runs bf16 GEMMs (whether the CPU does so natively is
    kernels/cpu_features.py's question)."""
    return is_available(torch.device("cpu"), torch.float32) and torch.ops.mkldnn._is_mkldnn_bf16_supported()


# oneDNN caches one primitive per GEMM shape (the step's token count is part of it): its
# default 1024 grew with every prompt length, 64 kept speed (docs/performance.md). oneDNN
# reads the variable once, at its first primitive; a user's value wins.
PRIMITIVE_CACHE_CAPACITY = "64"


def pack_weight(weight: Tensor) -> Tensor:
    """weight (out, in), as F.linear takes it, float32 or bfloat16 -> an opaque oneDNN tensor of its dtype."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", PRIMITIVE_CACHE_CAPACITY)
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_BATCH_HINT)


def packed_linear(x: Tensor, packed_weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (M, in) -> (M, out) = x @ weight^T + bias, in the packed weight's dtype (x must have it)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed_weight, bias, "none", [], "")


@functools.cache
def bf16_gemm_speedup(rows: int = 512, size: int = 2048, rounds: int = 3) -> float:
    """float32 GEMM time over bfloat16's on this machine: (rows, size) @ (size, size)^T, both prepacked,
    interleaved, the median of `rounds` rounds of best-of-3 (~0.3 s once per process). Native bf16 is not
    always faster (kernels/cpu_features.py), so prefill's "auto" dtype asks this."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(size, size, generator=generator)
    x = torch.randn(rows, size, generator=generator)
    paths = {dtype: (x.to(dtype), pack_weight(weight.to(dtype))) for dtype in (torch.float32, torch.bfloat16)}
    ratios = []
    for _ in range(rounds):
        best = {}
        for dtype, (inputs, packed) in paths.items():
            packed_linear(inputs, packed, None)  # warm-up: the primitive is made on the first call
            times = []
            for _ in range(3):
                started = time.perf_counter()
                packed_linear(inputs, packed, None)
                times.append(time.perf_counter() - started)
            best[dtype] = min(times)
        ratios.append(best[torch.float32] / best[torch.bfloat16])
    return statistics.median(ratios)

"""bfloat16 products inside float32 GEMMs: oneDNN's bf16 math mode for float32 matmuls
(`torch.backends.mkldnn.matmul.fp32_precision = "bf16"`).

Under it oneDNN rounds a float32 GEMM's x and weight to bf16 (to nearest even, as `.bfloat16()` does),
multiplies them on AMX, and accumulates and writes float32. Against GEMMs over bf16 tensors (x.bfloat16() @
w.bfloat16().T) the products are the same, but the output is not rounded to bf16, and a row's bits do not
depend on how many rows share the GEMM once it has MIN_ROWS rows: measured on an AMX Xeon for 16..1024 rows,
weights 32..8192 wide and deep, prepacked or not, 1 or 2 threads (tests/kernels/test_bf16_products.py),
where a GEMM over bf16 tensors agreed only up to 3 rows (docs/performance.md, "bfloat16 products"). Fewer
rows of a narrow weight (m * out up to ~2048) took another oneDNN kernel whose rows differed, so callers
pad to MIN_ROWS (`padded_rows`).

The mode is the process's (every thread's float32 GEMMs, bmm included), so `bf16_products()` sets it only
around the GEMMs that ask for it; the server runs all its torch work on the engine thread
(engine/async_engine.py, run_compute). Where oneDNN has no such kernel (a CPU without AMX: an AMD EPYC
with AVX512_BF16 ran float32 all the same), the mode changes nothing, so `run_here()` checks by the result.
"""

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch import Tensor

_MATMUL = torch.backends.mkldnn.matmul
# The fewest rows a GEMM under bf16 products is given (zeros padded), so that every row count takes the same
# oneDNN kernel.
MIN_ROWS = 16


@contextlib.contextmanager
def bf16_products() -> Iterator[None]:
    """float32 GEMMs inside multiply in bf16 (accumulate and write float32) where `run_here()`."""
    before = _MATMUL.fp32_precision
    _MATMUL.fp32_precision = "bf16"
    try:
        yield
    finally:
        _MATMUL.fp32_precision = before


@functools.cache
def run_here() -> bool:
    """Whether oneDNN multiplies float32 GEMMs in bf16 under `bf16_products()` on this machine: the product
    of a small GEMM equals float32's over the bf16-rounded inputs (to float32 rounding) and not float32's."""
    if not torch.backends.mkldnn.is_available():
        return False
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(64, 256, generator=generator), torch.randn(128, 256, generator=generator)
    exact = x @ weight.T
    rounded = x.bfloat16().float() @ weight.bfloat16().float().T
    with bf16_products():
        product = x @ weight.T
    tolerance = 1e-4 * float(exact.abs().max())
    return (float((product - rounded).abs().max()) <= tolerance
            and float((product - exact).abs().max()) > 10 * tolerance)


def padded_rows(x: Tensor) -> Tensor:
    """x (M, in) with zero rows appended up to MIN_ROWS (x itself when it has that many)."""
    if x.shape[0] >= MIN_ROWS:
        return x
    padded = x.new_zeros((MIN_ROWS, x.shape[1]))
    padded[:x.shape[0]] = x
    return padded

"""Fused AVX2 matrix-vector products for decode on CPU (kernels/csrc/matvec.c).

Batch-1 decode streams every weight once per token, so its speed is the
weight stream's. Two kernels:

- `matvec` over a row-major float32 weight: 22-26 GB/s on SmolLM2's shapes
  against 10-20 for oneDNN's prepacked GEMM at one row (docs/performance.md).

- `matmul_blocks` over a weight kept in the GGUF block format it was shipped
  in (Q4_1 or Q8_0, `BlockWeight`): the same weight values the float32 copy
  holds (the copy is their dequantization), in 6 or 9 bits each instead of
  32, so a decode step reads a fraction of the bytes. It takes up to a few
  rows of x at a time, decoding each block of the weight once for all of them.

`load()` raises native_build.NativeUnavailable where the kernels cannot run;
callers then keep their torch path, which is also the tests' reference.
"""

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from kernels.block_formats import FORMATS, BlockWeight
from kernels.kernel_program import note_unrecorded
from kernels.native_build import FIND_COMPILER, load_library

# The fixed crossover (the default): up to this many rows the blocks beat oneDNN's float32 GEMM on
# SmolLM2, or nearly (the Q8_0 head at 7-8 rows; docs/performance.md), so that a decode step and a
# speculative verify chunk of up to 8 rows run every projection in the one kernel, whose rows do not
# depend on how many share a call. The cpu backend can measure it per shape at load instead.
BLOCKS_MAX_ROWS = {"Q4_1": 8, "Q8_0": 8}
# The formats matmul_blocks (kernels/csrc/matvec.c) reads, in their run-time layouts (block_formats.py).
MATVEC_FORMATS = ("Q4_1", "Q8_0")


class CpuMatvec:
    """The loaded kernels."""

    def __init__(self, library: ctypes.CDLL):
        self._matvec = library.matvec_f32
        self._matvec.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_int]
        self._matvec.restype = None
        self._matmul_blocks = library.matmul_blocks
        self._matmul_blocks.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        self._matmul_blocks.restype = ctypes.c_int

    @staticmethod
    def fits(weight: Tensor) -> bool:
        return (
            weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and weight.dim() == 2
            and weight.is_contiguous()
            and weight.shape[1] % 8 == 0
        )

    def __call__(self, x: Tensor, weight: Tensor) -> Tensor:
        """x (1, in) @ weight^T for a row-major (out, in) float32 weight -> (1, out)."""
        rows, cols = weight.shape
        x = x.contiguous()
        if x.shape != (1, cols) or x.dtype != torch.float32:
            raise ValueError(f"matvec wants x (1, {cols}) float32, got {tuple(x.shape)} {x.dtype}")
        out = torch.empty((1, rows), dtype=torch.float32)
        note_unrecorded("matvec_f32")
        self._matvec(weight.data_ptr(), x.data_ptr(), out.data_ptr(), rows, cols, torch.get_num_threads())
        return out

    def matmul_blocks(self, x: Tensor, weight: BlockWeight) -> Tensor:
        """x (m, in) float32 @ weight^T -> (m, out)."""
        x = x.contiguous()
        if weight.format not in MATVEC_FORMATS:
            raise ValueError(f"matmul_blocks reads {', '.join(MATVEC_FORMATS)}, not {weight.format}")
        if x.dim() != 2 or x.shape[1] != weight.cols or x.dtype != torch.float32:
            raise ValueError(f"matmul_blocks wants x (m, {weight.cols}) float32, got {tuple(x.shape)} {x.dtype}")
        out = torch.empty((x.shape[0], weight.rows), dtype=torch.float32)
        note_unrecorded("matvec_blocks")
        status = self._matmul_blocks(FORMATS[weight.format].code, weight.blocks.data_ptr(), x.data_ptr(),
                                     out.data_ptr(), x.shape[0], weight.rows, weight.cols, torch.get_num_threads())
        if status:
            raise MemoryError("matmul_blocks: no memory for the accumulators of a column-tiled product")
        return out


def load(build_dir: Path, compiler: str | None = FIND_COMPILER, variant: str = "avx2") -> CpuMatvec:
    """Build (once, cached by source hash) and load the kernels (kernels.cpu_features variant, or
    the best below it they have); raises native_build.NativeUnavailable where they cannot run here."""
    return CpuMatvec(load_library("matvec", build_dir, compiler, variant))

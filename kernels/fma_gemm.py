"""Prefill GEMMs over weights held in block formats, in float32 with 256-bit FMA (kernels/csrc/gemm_fma.c).

`FmaGemm.matmul(x, weight)` is x @ W^T (M, N) float32 for x (M, K) float32 and a weight in any block format
(kernels/block_formats.py), its panels decoded to float32 by the kernel as it goes: the float32 products of a
GEMM over the dequantized weight, without a float32 copy of it or a tile that oneDNN reorders on every call.
`matmul_interleaved` is the same over a copy of the weight in the int8 GEMM's 8 interleaved rows (the AVX2
decode copies of Q4_1 / Q4_K / Q6_K projections, kernels/cpu_gemm_q8.py), whose panels decode without a transpose: the
same weights, so the same bits. A row's bits do not depend on the row count, the other rows or the thread count.
N must be a multiple of 16 and K of 32 (`supports`).

Where it runs: CPUs whose kernels are the avx2 build (AVX2 + FMA, no AVX-512), where float32 is the fastest GEMM
(no native bf16; the int8 GEMM measured slower than oneDNN's float32 on an AMD EPYC of that kind:
docs/performance.md, "Prefill over blocks with FMA"). `load` raises native_build.NativeUnavailable where it
cannot run.
"""

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from kernels.block_formats import BlockWeight
from kernels.block_matmul import product_out
from kernels.cpu_gemm_q8 import Q16_AVX2_FORMATS, PackedBlocks
from kernels.kernel_program import note_unrecorded
from kernels.native_build import FIND_COMPILER, load_library

__all__ = ["FmaGemm", "load"]

ROW_MULTIPLE = 16  # a weight's rows: a multiple of this (a slice of the kernel's panels)
COL_MULTIPLE = 32


class FmaGemm:
    instruction_set = "avx2"
    label = "FMA GEMM"  # as describe() names it
    products = "float32"  # how it multiplies
    row_multiple = ROW_MULTIPLE  # a weight's rows are multiples of this (`supports`)

    def __init__(self, library: ctypes.CDLL):
        self._gemm = library.blocks_fma_gemm
        self._gemm.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_int64, ctypes.c_int]
        self._gemm.restype = ctypes.c_int
        self._gemm_interleaved = library.blocks_fma_gemm_interleaved
        self._gemm_interleaved.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                           ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                           ctypes.c_int64, ctypes.c_int]
        self._gemm_interleaved.restype = ctypes.c_int

    @staticmethod
    def supports(weight: BlockWeight) -> bool:
        return weight.rows % ROW_MULTIPLE == 0 and weight.cols % COL_MULTIPLE == 0

    @staticmethod
    def reads(copy: PackedBlocks) -> bool:
        """Whether `matmul_interleaved` takes this copy: Q4_1 / Q4_K / Q6_K in 8 interleaved rows (the AVX2 layouts)."""
        return copy.variant == "avx2" and FmaGemm.reads_copy_of(copy)

    @staticmethod
    def reads_copy_of(weight: BlockWeight | PackedBlocks) -> bool:
        """Whether an AVX2 copy of this weight in interleaved rows is one `matmul_interleaved` takes."""
        return (weight.format in Q16_AVX2_FORMATS and weight.rows % ROW_MULTIPLE == 0
                and weight.cols % COL_MULTIPLE == 0)

    @staticmethod
    def _check_x(x: Tensor, cols: int) -> None:
        if x.dim() != 2 or x.dtype != torch.float32 or x.stride(1) != 1 or x.shape[1] != cols:
            raise ValueError(f"FMA GEMM: x must be (M, {cols}) float32 with contiguous rows, got {x.dtype} "
                             f"{tuple(x.shape)} strides {x.stride()}")

    @staticmethod
    def pack(x: Tensor) -> Tensor:
        """x itself (the kernel reads float32 rows as they are): the A operand, as AmxGemm.pack makes its own."""
        return x

    def matmul(self, x: Tensor, weight: BlockWeight, out: Tensor | None = None) -> Tensor:
        """x @ weight^T -> (M, weight.rows) float32 (into `out` when given: rows contiguous, such as the columns
        of a wider output)."""
        self._check_x(x, weight.cols)
        if not self.supports(weight):
            raise ValueError(f"FMA GEMM: a {weight.rows} x {weight.cols} weight (rows a multiple of "
                             f"{ROW_MULTIPLE}, columns of {COL_MULTIPLE})")
        out = product_out(out, x.shape[0], weight.rows)
        spec = weight.spec
        note_unrecorded("blocks_fma_gemm")
        status = self._gemm(spec.code, spec.block_size, spec.bytes, weight.blocks.data_ptr(), x.data_ptr(),
                            x.stride(0), x.shape[0], weight.rows, weight.cols, out.data_ptr(), out.stride(0),
                            torch.get_num_threads())
        if status == -3:
            raise MemoryError("FMA GEMM: no memory for a thread's panel")
        if status:
            raise ValueError(f"FMA GEMM: format {weight.format} unknown to the kernel (status {status})")
        return out

    def matmul_interleaved(self, x: Tensor, copy: PackedBlocks, out: Tensor | None = None) -> Tensor:
        """x @ W^T like `matmul`, its panels from a copy of W in the int8 GEMM's 8 interleaved rows (the decode
        copies of model/backends/decode_copies.py): the same bits as `matmul` over W's blocks (tested)."""
        self._check_x(x, copy.cols)
        if not self.reads(copy):
            raise ValueError(f"FMA GEMM: a {copy.format} copy of {copy.rows} x {copy.cols} in {copy.variant} rows "
                             f"(it reads {', '.join(Q16_AVX2_FORMATS)} in 8 interleaved rows, rows a multiple of "
                             f"{ROW_MULTIPLE})")
        out = product_out(out, x.shape[0], copy.rows)
        note_unrecorded("blocks_fma_gemm_interleaved")
        status = self._gemm_interleaved(copy.layout, copy.packed.data_ptr(), x.data_ptr(), x.stride(0), x.shape[0],
                                        copy.rows, copy.cols, out.data_ptr(), out.stride(0), torch.get_num_threads())
        if status == -3:
            raise MemoryError("FMA GEMM: no memory for a thread's panel")
        if status:
            raise ValueError(f"FMA GEMM over interleaved rows: status {status}")
        return out


def load(build_dir: Path, compiler: str | None = FIND_COMPILER, variant: str = "avx2") -> FmaGemm:
    """The avx2 build, built once and cached; raises NativeUnavailable where the CPU lacks AVX2 / FMA / F16C (or
    `variant` is portable) or there is no compiler."""
    return FmaGemm(load_library("blocks_fma", build_dir, compiler, variant))

"""Prefill GEMMs over weights held in block formats, on AMX tiles (kernels/csrc/gemm_amx.c).

`AmxGemm.pack(x)` rounds x (M, K) float32 to bf16 once (rows padded to 32 with zeros); `matmul(packed,
weight)` is x @ W^T (M, N) float32 for a weight in any block format (kernels/block_formats.py), its panels
decoded and rounded to bf16 by the kernel as it goes: bf16 products, float32 sums and output, the math of
oneDNN's bf16 products in a float32 GEMM over dequantized tiles (kernels/bf16_products.py) without a float32
tile, its conversion or its reordering. A row's bits do not depend on the row count, on the other rows or on
the thread count. N and K must be multiples of 32 (`supports`). `matmul_interleaved` is the same product over a
copy of the weight in the int8 GEMM's 16 interleaved rows (kernels/cpu_gemm_q8.py: the decode copies of Q4_1 / Q4_K
projections), whose panels decode without a transpose.

One build, "amx_bf16" (AVX-512 with AMX-TILE, AMX-BF16 and AVX512_BF16); `load` raises
native_build.NativeUnavailable elsewhere, and where Linux does not grant the tile state.
"""

import ctypes
from pathlib import Path

import torch
from torch import Tensor

from kernels.block_formats import BlockWeight
from kernels.block_matmul import product_out
from kernels.cpu_gemm_q8 import Q16_FORMATS, PackedBlocks
from kernels.kernel_program import note_unrecorded
from kernels.native_build import FIND_COMPILER, NativeUnavailable, load_library

__all__ = ["AmxGemm", "PackedRows", "load"]

ROW_MULTIPLE = 32  # pack pads x's rows to a multiple of this (a 2 x 2 tile product's rows)


class PackedRows:
    """x (rows, cols) rounded to bf16, rows padded to ROW_MULTIPLE with zeros: the A operand of `matmul`."""

    def __init__(self, data: Tensor, rows: int):
        self.data = data  # (padded rows, cols) bfloat16
        self.rows = rows

    @property
    def cols(self) -> int:
        return self.data.shape[1]


class AmxGemm:
    instruction_set = "amx_bf16"
    label = "AMX GEMM"  # as describe() names it
    products = "bf16 products"  # how it multiplies
    row_multiple = ROW_MULTIPLE  # a weight's rows and columns are multiples of this (`supports`)

    def __init__(self, library: ctypes.CDLL):
        self._pack = library.blocks_amx_pack_rows
        self._pack.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_int]
        self._pack.restype = ctypes.c_int
        self._gemm = library.blocks_amx_gemm
        self._gemm.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                               ctypes.c_int]
        self._gemm.restype = ctypes.c_int
        self._gemm_interleaved = library.blocks_amx_gemm_interleaved
        self._gemm_interleaved.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                           ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
        self._gemm_interleaved.restype = ctypes.c_int
        # pack's output, kept and grown: a fresh one (up to 8 MiB a projection at 512 rows) was a fresh mapping whose
        # pages faulted in and were zeroed on every call (4% of a 1B model's prefill)
        self._rows_buffer = torch.empty(0, dtype=torch.bfloat16)

    @staticmethod
    def supports(weight: BlockWeight) -> bool:
        return weight.rows % ROW_MULTIPLE == 0 and weight.cols % ROW_MULTIPLE == 0

    def pack(self, x: Tensor) -> PackedRows:
        """x (M, K) float32 with contiguous rows -> PackedRows, valid until the next pack (one buffer serves
        every call: a projection packs its x, multiplies it by its parts, and is done with it)."""
        if x.dim() != 2 or x.dtype != torch.float32 or x.stride(1) != 1 or x.shape[1] % ROW_MULTIPLE:
            raise ValueError(f"AMX GEMM packs x (M, K) float32 with contiguous rows and K a multiple of "
                             f"{ROW_MULTIPLE}, got {x.dtype} {tuple(x.shape)} strides {x.stride()}")
        rows, cols = x.shape
        padded = -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE
        if self._rows_buffer.numel() < padded * cols:
            self._rows_buffer = torch.empty(padded * cols, dtype=torch.bfloat16)
        data = self._rows_buffer[:padded * cols].view(padded, cols)
        note_unrecorded("blocks_amx_pack_rows")
        self._pack(x.data_ptr(), rows, cols, x.stride(0), data.data_ptr(), torch.get_num_threads())
        return PackedRows(data, rows)

    def matmul(self, x: PackedRows, weight: BlockWeight, out: Tensor | None = None) -> Tensor:
        """x @ weight^T -> (x.rows, weight.rows) float32 (into `out` when given: rows contiguous, such as
        the columns of a wider output)."""
        if x.cols != weight.cols or not self.supports(weight):
            raise ValueError(f"AMX GEMM: x has {x.cols} columns against a {weight.rows} x {weight.cols} weight "
                             f"(both must be multiples of {ROW_MULTIPLE})")
        out = product_out(out, x.rows, weight.rows)
        spec = weight.spec
        note_unrecorded("blocks_amx_gemm")
        status = self._gemm(spec.code, spec.block_size, spec.bytes, weight.blocks.data_ptr(), x.data.data_ptr(),
                            x.rows, weight.rows, weight.cols, out.data_ptr(), out.stride(0), torch.get_num_threads())
        if status == -3:
            raise MemoryError("AMX GEMM: no memory for a thread's panel")
        if status:
            raise ValueError(f"AMX GEMM: format {weight.format} unknown to the kernel (status {status})")
        return out


    @staticmethod
    def reads(copy: PackedBlocks) -> bool:
        """Whether `matmul_interleaved` takes this copy: Q4_1 / Q4_K in 16 interleaved rows (the AVX-512 layout)."""
        return (copy.format in Q16_FORMATS and copy.variant == "avx512_vnni" and copy.rows % ROW_MULTIPLE == 0
                and copy.cols % ROW_MULTIPLE == 0)

    def matmul_interleaved(self, x: PackedRows, copy: PackedBlocks, out: Tensor | None = None) -> Tensor:
        """x @ W^T like `matmul`, its panels decoded from a copy of W in the int8 GEMM's interleaved rows (the
        decode copies of model/backends/decode_copies.py): no transpose, no scale per row; the same weights,
        so the same bits as `matmul` over W's blocks (tested)."""
        if x.cols != copy.cols or not self.reads(copy):
            raise ValueError(f"AMX GEMM: x has {x.cols} columns against a {copy.format} copy of {copy.rows} x "
                             f"{copy.cols} in {copy.variant} rows (it reads {', '.join(Q16_FORMATS)} in 16 "
                             f"interleaved rows, both sizes multiples of {ROW_MULTIPLE})")
        out = product_out(out, x.rows, copy.rows)
        note_unrecorded("blocks_amx_gemm_interleaved")
        status = self._gemm_interleaved(copy.layout, copy.packed.data_ptr(), x.data.data_ptr(), x.rows, copy.rows, copy.cols,
                                        out.data_ptr(), out.stride(0), torch.get_num_threads())
        if status == -3:
            raise MemoryError("AMX GEMM: no memory for a thread's panel")
        if status:
            raise ValueError(f"AMX GEMM over interleaved rows: status {status}")
        return out


def load(build_dir: Path, compiler: str | None = FIND_COMPILER, variant: str = "avx512_vnni") -> AmxGemm:
    """The AMX build, built once and cached; raises NativeUnavailable where the CPU lacks AMX-TILE / AMX-BF16 /
    AVX512_BF16 (or `variant`, the kernels asked for, is below avx512_vnni), there is no compiler, or Linux
    does not grant the tile state."""
    library = load_library("blocks_amx", build_dir, compiler, variant)
    library.blocks_amx_ready.restype = ctypes.c_int64
    if library.blocks_amx_ready() != 0:
        raise NativeUnavailable("blocks_amx: Linux did not grant the AMX tile state (arch_prctl)")
    return AmxGemm(library)

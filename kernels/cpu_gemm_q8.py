"""Products over GGUF blocks with int8 activations, prefill and decode (kernels/csrc/gemm_q8.c).

A prefill chunk of m rows times a weight kept in its GGUF blocks: x is quantized per
block of 32 to int8 (llama.cpp's Q8 activations, scale max|x| / 127, in float32), and
each block's dot product is an integer one (AVX-512 VNNI `vpdpbusd`, or AVX2
`maddubs`), scaled by the weight block's and x block's scales. No float32 copy of the
weight exists; the blocks are repacked once at load into groups of 16 (AVX-512) or 8
(AVX2) rows interleaved by 4 bytes (`repack`), the same bytes per weight as the
blocks they come from (plus the padding of a last partial group).

Numerics: the weights are exactly the blocks' values; x carries a rounding error of at
most half its block's scale per element. The quality this costs a model is measured
(docs/performance.md); the cpu backend uses the path where that measurement allows.

`matmul_q16` multiplies the same repacked Q4_1 / Q4_K weights (and, AVX2 build, Q6_K) by int16 activations instead (the
few-rows block kernels' quantization, kernels/csrc/q16_activations.h), for decode: the weights read
16 (8) rows a vector with x's bytes broadcast, where the block kernels read one row's blocks at a
time (docs/performance.md, "Decode over interleaved rows").
`load()` raises native_build.NativeUnavailable where the kernels cannot run.
"""

import ctypes
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from kernels.block_formats import FORMATS, BlockWeight
from kernels.block_matmul import product_out
from kernels.kernel_program import PackedKernel, note_unrecorded
from kernels.native_build import FIND_COMPILER, library_variant, load_library

# The block formats (kernels/block_formats.py) the kernels repack: Q4_1 into 32-weight groups with a float32
# scale and min each (24 bytes per 32 weights against its 20), Q4_K keeping its 6-bit scales and mins as bytes
# and its blocks' d and -dmin as floats (19.5 bytes per 32 against 18: kernels/csrc/interleaved_rows.h; the
# kernels make d * sc and -dmin * m, exact in float32), Q4_0 and Q8_0 into groups with a float32 scale (20 and
# 36 bytes).
GEMM_FORMATS = ("Q4_0", "Q4_1", "Q8_0", "Q4_K")
# The formats every build's matmul_q16 reads repacked (the layouts with a scale and a min per 32 weights), which the
# prefill GEMMs over blocks also read from the repacked copy (kernels/amx_gemm.py, kernels/fma_gemm.py)
Q16_FORMATS = ("Q4_1", "Q4_K")
# The AVX2 build's matmul_q16 reads Q6_K repacked too, keeping its 6-bit values (26.5 bytes a row's 32 weights,
# Q6_K's 26.25: kernels/csrc/interleaved_rows.h); only that product reads this copy.
Q16_AVX2_FORMATS = Q16_FORMATS + ("Q6_K",)
# gemm_q16_packed's fields: layout, packed W, x, y, m, rows, cols, y's row stride, threads
_Q16_ARGS = struct.Struct("<9q").pack


@dataclass(frozen=True)
class PackedBlocks:
    """A (rows, cols) weight repacked for one kernel variant: `packed` is opaque uint8."""

    format: str  # the source format (kernels/block_formats.py)
    layout: int  # the C kernels' layout code for it
    packed: Tensor
    rows: int
    cols: int
    variant: str  # the variant whose layout this is (the group height differs)


class CpuGemmQ8:
    """The loaded kernels of one variant."""

    def __init__(self, library: ctypes.CDLL):
        variant_name = library.gemm_q8_variant
        variant_name.restype = ctypes.c_char_p
        self.variant = variant_name().decode()
        self.interleave = int(library.gemm_q8_interleave())  # rows a group: 16 (AVX-512), 8 (AVX2)
        self._layout = library.gemm_q8_layout
        self._layout.argtypes = [ctypes.c_int]
        self._layout.restype = ctypes.c_int
        self._packed_bytes = library.gemm_q8_packed_bytes
        self._packed_bytes.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        self._packed_bytes.restype = ctypes.c_int64
        self._repack = library.gemm_q8_repack
        self._repack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                 ctypes.c_int64]
        self._repack.restype = None
        self._gemm = library.gemm_q8
        self._gemm.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        self._gemm.restype = ctypes.c_int
        self._gemm_q16 = PackedKernel(library.gemm_q16_packed)  # recordable (kernels/kernel_program.py)
        # the formats this build's matmul_q16 reads repacked
        self.q16_formats = tuple(f for f in Q16_AVX2_FORMATS if self._layout(FORMATS[f].code) >= 0)

    @staticmethod
    def fits(weight: BlockWeight) -> bool:
        return weight.format in GEMM_FORMATS

    def repack(self, weight: BlockWeight) -> PackedBlocks:
        """The weight's values in the kernels' interleaved layout (a new tensor; `weight` unchanged)."""
        if not self.fits(weight) and weight.format not in self.q16_formats:
            raise ValueError(f"gemm_q8 reads {', '.join(GEMM_FORMATS)} blocks, not {weight.format}")
        code = FORMATS[weight.format].code
        layout = self._layout(code)
        packed = torch.empty(self._packed_bytes(layout, weight.rows, weight.cols), dtype=torch.uint8)
        self._repack(code, weight.blocks.data_ptr(), weight.blocks.shape[1], packed.data_ptr(), weight.rows,
                     weight.cols)
        return PackedBlocks(weight.format, layout, packed, weight.rows, weight.cols, self.variant)

    def __call__(self, x: Tensor, weight: PackedBlocks) -> Tensor:
        """x (m, in) float32 @ weight^T -> (m, out) float32."""
        x = x.contiguous()
        if x.dim() != 2 or x.shape[1] != weight.cols or x.dtype != torch.float32:
            raise ValueError(f"gemm_q8 wants x (m, {weight.cols}) float32, got {tuple(x.shape)} {x.dtype}")
        if weight.variant != self.variant:
            raise ValueError(f"weight packed for {weight.variant}, kernels are {self.variant}")
        if weight.format not in GEMM_FORMATS:
            raise ValueError(f"gemm_q8 reads {', '.join(GEMM_FORMATS)} repacked, not {weight.format}")
        out = torch.empty((x.shape[0], weight.rows), dtype=torch.float32)
        note_unrecorded("gemm_q8")
        status = self._gemm(weight.layout, weight.packed.data_ptr(), x.data_ptr(), out.data_ptr(),
                            x.shape[0], weight.rows, weight.cols, torch.get_num_threads())
        if status:
            raise MemoryError("gemm_q8: no memory for the quantized activations")
        return out


    def matmul_q16(self, x: Tensor, weight: PackedBlocks, out: Tensor | None = None) -> Tensor:
        """x (m, in) float32 @ weight^T -> (m, out) float32, x quantized to int16 per group of 32; into `out`
        when given: (m, weight.rows) float32 with contiguous rows (the columns of a fused projection's output)."""
        x = x.contiguous()
        if weight.format not in self.q16_formats:
            raise ValueError(f"matmul_q16 reads {', '.join(self.q16_formats)} repacked, not {weight.format}")
        if x.dim() != 2 or x.shape[1] != weight.cols or x.dtype != torch.float32:
            raise ValueError(f"matmul_q16 wants x (m, {weight.cols}) float32, got {tuple(x.shape)} {x.dtype}")
        if weight.variant != self.variant:
            raise ValueError(f"weight packed for {weight.variant}, kernels are {self.variant}")
        out = product_out(out, x.shape[0], weight.rows)
        status = self._gemm_q16(_Q16_ARGS(weight.layout, weight.packed.data_ptr(), x.data_ptr(), out.data_ptr(),
                                          x.shape[0], weight.rows, weight.cols, out.stride(0),
                                          torch.get_num_threads()))
        if status == -2:
            raise MemoryError("matmul_q16: no memory for the quantized activations")
        if status:
            raise ValueError(f"matmul_q16: layout {weight.layout} has no scale and min per 32 weights")
        return out


def load(build_dir: Path, compiler: str | None = FIND_COMPILER, variant: str = "avx2") -> CpuGemmQ8:
    """Build (once, cached by source hash) and load the best variant at or below `variant`;
    raises native_build.NativeUnavailable where none can run here."""
    return CpuGemmQ8(load_library("gemm_q8", build_dir, compiler, variant))


def built_variant(variant: str) -> str | None:
    """The variant load(variant=...) builds (None: none)."""
    return library_variant("gemm_q8", variant)

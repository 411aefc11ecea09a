"""Products and row dequantization over weights in any block format (kernels/csrc/block_matmul.c;
the formats are kernels/block_formats.py's table).

- `matmul(x, weight)`: x (m, in) @ W^T for a few rows (decode), reading the blocks: each weight
  decoded to exactly its dequantized float32 value, so results equal a float32 product over
  `dequantize_reference(weight)` up to summation order; a row's bits do not depend on m.
- `matmul_q16(x, weight)`: the same product with x quantized to int16 per group of 32 values
  (kernels/csrc/block_matmul_q16.c): integer dot products against the blocks' integer weights,
  about 3x fewer instructions a weight than `matmul`. The weights are exact; x's rounding costs at
  most max|x over its group| / 65534 a value (Q16_TOLERANCE). Every build gives the same bits,
  and a row's bits do not depend on m. F16/BF16/F32 weights run `matmul`.
- `dequantize_rows(weight, ...)`: float32 (or bfloat16) rows of the weight (the embedding's looked-up
  rows; the tiles a prefill GEMM reads: model/backends/cpu_linear.py).

Builds (kernels/native_build.py): "avx512_vnni" (`vpdpwssd` in matmul_q16; Q4_K, Q6_K and Q8_0 rows two
groups a 512-bit vector, the same bits as AVX2's; Q4_K and Q6_K at 1-2 rows as byte products, x split
into a low and a high byte against the unwidened weights with `vpdpbusd`), "avx2" (AVX2 + FMA + F16C;
the byte products at 1 row with `vpmaddubsw`) and "portable" (plain C); `load_best` takes the best the CPU runs at or below the variant asked for,
`load(..., portable=True)` the plain-C one (tests run every build this machine has).
"""

import ctypes
import struct
from pathlib import Path

import torch
from torch import Tensor

from kernels.block_formats import BlockWeight
from kernels.cpu_features import PORTABLE
from kernels.kernel_program import PackedKernel, note_unrecorded
from kernels.native_build import FIND_COMPILER, NativeUnavailable, library_variant, load_library

# |matmul_q16 - exact product| <= Q16_TOLERANCE * sum_j |w_j| * max|x over j's group of 32|:
# each x value is off by at most half a step of max|x| / 32767 (plus float32 sums' rounding).
Q16_TOLERANCE = 1.0 / 65534 + 1e-6
# blocks_matmul(_q16)_packed's fields: format code, block size, block bytes, W, x, y, m, rows, cols, y's row
# stride, threads
_PRODUCT_ARGS = struct.Struct("<11q").pack


class BlockKernels:
    def __init__(self, library: ctypes.CDLL, instruction_set: str):
        self.instruction_set = instruction_set  # "avx512_vnni", "avx2" or "portable"
        # packed-argument entry points: recordable (kernels/kernel_program.py)
        self._matmul = PackedKernel(library.blocks_matmul_packed)
        self._matmul_q16 = PackedKernel(library.blocks_matmul_q16_packed)
        self._dequantize = library.blocks_dequantize_rows
        self._dequantize.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
        self._dequantize.restype = ctypes.c_int
        self._dequantize_bf16 = library.blocks_dequantize_rows_bf16
        self._dequantize_bf16.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                          ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
        self._dequantize_bf16.restype = ctypes.c_int

    def matmul(self, x: Tensor, weight: BlockWeight, out: Tensor | None = None) -> Tensor:
        """x (m, in) float32 @ weight^T -> (m, out), float32 activations."""
        return self._product(self._matmul, x, weight, out)

    def matmul_q16(self, x: Tensor, weight: BlockWeight, out: Tensor | None = None) -> Tensor:
        """x (m, in) float32 @ weight^T -> (m, out), x quantized to int16 per group of 32."""
        return self._product(self._matmul_q16, x, weight, out)

    @staticmethod
    def _product(kernel, x: Tensor, weight: BlockWeight, out: Tensor | None) -> Tensor:
        """Into `out` when given: (m, weight.rows) float32 whose rows are contiguous, such as the columns of
        a wider output that parts of a fused projection fill (no concatenation after)."""
        x = x.contiguous()
        if x.dim() != 2 or x.shape[1] != weight.cols or x.dtype != torch.float32:
            raise ValueError(f"blocks matmul wants x (m, {weight.cols}) float32, got {tuple(x.shape)} {x.dtype}")
        spec = weight.spec
        out = product_out(out, x.shape[0], weight.rows)
        status = kernel(_PRODUCT_ARGS(spec.code, spec.block_size, spec.bytes, weight.blocks.data_ptr(), x.data_ptr(),
                                      out.data_ptr(), x.shape[0], weight.rows, weight.cols, out.stride(0),
                                      torch.get_num_threads()))
        if status == -2:
            raise MemoryError("blocks matmul: no memory for the quantized activations")
        if status:
            raise ValueError(f"blocks matmul: format {weight.format} unknown to the C kernels")
        return out

    def dequantize_rows(self, weight: BlockWeight, row_ids: Tensor | None = None, first: int = 0,
                        count: int | None = None, out: Tensor | None = None) -> Tensor:
        """float32 rows of the weight: rows `row_ids` (int64, any shape -> (*shape, cols)), or rows
        first .. first + count (into `out`, (count, cols), when given: float32, or bfloat16 for the
        float32 values rounded to nearest even, as torch's .to(torch.bfloat16) rounds them)."""
        spec = weight.spec
        if row_ids is not None:
            ids = row_ids.reshape(-1).to(torch.int64).contiguous()
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= weight.rows):
                raise IndexError(f"row ids out of range for a weight of {weight.rows} rows")
            result = torch.empty((ids.numel(), weight.cols), dtype=torch.float32)
            note_unrecorded("blocks_dequantize_rows")
            self._dequantize(spec.code, spec.block_size, spec.bytes, weight.blocks.data_ptr(), ids.data_ptr(),
                             ids.numel(), weight.cols, result.data_ptr(), torch.get_num_threads())
            return result.reshape(*row_ids.shape, weight.cols)
        count = weight.rows - first if count is None else count
        if first < 0 or count < 0 or first + count > weight.rows:
            raise IndexError(f"rows {first}..{first + count} out of range for a weight of {weight.rows} rows")
        if out is None:
            out = torch.empty((count, weight.cols), dtype=torch.float32)
        elif (out.shape != (count, weight.cols) or out.dtype not in (torch.float32, torch.bfloat16)
              or not out.is_contiguous()):
            raise ValueError(f"out must be contiguous float32 or bfloat16 ({count}, {weight.cols}), "
                             f"got {out.dtype} {tuple(out.shape)}")
        start = weight.blocks.data_ptr() + first * weight.blocks.shape[1]
        note_unrecorded("blocks_dequantize_rows")
        if out.dtype == torch.bfloat16:
            self._dequantize_bf16(spec.code, spec.block_size, spec.bytes, start, count, weight.cols, out.data_ptr(),
                                  torch.get_num_threads())
        else:
            self._dequantize(spec.code, spec.block_size, spec.bytes, start, None, count, weight.cols,
                             out.data_ptr(), torch.get_num_threads())
        return out


def product_out(out: Tensor | None, m: int, rows: int) -> Tensor:
    """A product's output: `out` checked, (m, rows) float32 whose rows are contiguous (the columns of a wider
    output that parts of a fused projection fill), or a new tensor."""
    if out is None:
        return torch.empty((m, rows), dtype=torch.float32)
    if out.shape != (m, rows) or out.dtype != torch.float32 or out.stride(1) != 1 or out.stride(0) < rows:
        raise ValueError(f"out must be float32 ({m}, {rows}) with contiguous rows, got "
                         f"{out.dtype} {tuple(out.shape)} strides {out.stride()}")
    return out


def load(build_dir: Path, compiler: str | None = FIND_COMPILER, portable: bool = False,
         variant: str = "avx2") -> BlockKernels:
    """The build for `variant` (kernels.cpu_features: "avx512_vnni" or "avx2"; or, with `portable`,
    the plain-C one), built once and cached; raises native_build.NativeUnavailable where it cannot run."""
    if portable or variant == PORTABLE:
        return BlockKernels(load_library("blocks_portable", build_dir, compiler), "portable")
    return BlockKernels(load_library("blocks", build_dir, compiler, variant), library_variant("blocks", variant))


def load_best(build_dir: Path, compiler: str | None = FIND_COMPILER, variant: str = "avx2") -> BlockKernels:
    """The build for `variant` where this CPU runs it, else the portable one (`instruction_set`
    says which; the cpu backend's describe() names it)."""
    try:
        return load(build_dir, compiler, variant=variant)
    except NativeUnavailable:
        return load(build_dir, compiler, portable=True)

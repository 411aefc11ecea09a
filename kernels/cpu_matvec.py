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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from kernels.native_build import FIND_COMPILER, load_library

BLOCK_SIZE = 32  # weights per block along a row, both formats
# As GGUF stores a block: Q4_1 {fp16 d, fp16 min, 16 B of nibbles}, Q8_0 {fp16 d, 32 int8}.
GGUF_BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}
# As the kernels read it (BlockWeight.from_gguf): the scales widened to float32, so a
# block's scale is one broadcast load instead of a load, a conversion and a shuffle.
# Q4_1 {f32 d, f32 min, 16 B of nibbles}, Q8_0 {f32 d, 32 int8}.
BLOCK_BYTES = {"Q4_1": 24, "Q8_0": 36}
_FORMAT_CODES = {"Q4_1": 0, "Q8_0": 1}
# The fixed crossover (the default): up to this many rows the blocks beat oneDNN's float32 GEMM on
# SmolLM2, or nearly (the Q8_0 head at 7-8 rows; docs/performance.md), so that a decode step and a
# speculative verify chunk of up to 8 rows run every projection in the one kernel, whose rows do not
# depend on how many share a call. The cpu backend can measure it per shape at load instead.
BLOCKS_MAX_ROWS = {"Q4_1": 8, "Q8_0": 8}


@dataclass(frozen=True)
class BlockWeight:
    """A (rows, cols) weight as blocks of 32 along a row, in the kernels' layout:
    `blocks` is (rows, cols / 32 * BLOCK_BYTES[format]) uint8."""

    format: str  # "Q4_1" or "Q8_0"
    blocks: Tensor
    cols: int

    def __post_init__(self):
        if self.format not in BLOCK_BYTES:
            raise ValueError(f"unknown block format {self.format!r} (known: {', '.join(BLOCK_BYTES)})")
        expected = (self.cols // BLOCK_SIZE) * BLOCK_BYTES[self.format]
        if (self.cols % BLOCK_SIZE or self.blocks.dtype != torch.uint8 or self.blocks.dim() != 2
                or self.blocks.shape[1] != expected or not self.blocks.is_contiguous()):
            raise ValueError(
                f"{self.format} weight with {self.cols} columns needs contiguous uint8 blocks (rows, {expected}), "
                f"got {self.blocks.dtype} {tuple(self.blocks.shape)}"
            )

    @property
    def rows(self) -> int:
        return self.blocks.shape[0]

    @staticmethod
    def from_gguf(block_format: str, gguf_rows: np.ndarray, cols: int) -> "BlockWeight":
        """From GGUF's blocks, (rows, cols / 32 * GGUF_BLOCK_BYTES) uint8: the same
        quantized values, with the fp16 scales widened (exactly) to float32."""
        if block_format not in GGUF_BLOCK_BYTES:
            raise ValueError(f"unknown block format {block_format!r} (known: {', '.join(GGUF_BLOCK_BYTES)})")
        num_blocks, gguf_bytes = cols // BLOCK_SIZE, GGUF_BLOCK_BYTES[block_format]
        if cols % BLOCK_SIZE or gguf_rows.dtype != np.uint8 or gguf_rows.ndim != 2 \
                or gguf_rows.shape[1] != num_blocks * gguf_bytes:
            raise ValueError(f"{block_format} weight with {cols} columns needs uint8 GGUF blocks "
                             f"(rows, {num_blocks * gguf_bytes}), got {gguf_rows.dtype} {gguf_rows.shape}")
        rows = gguf_rows.shape[0]
        gguf_blocks = gguf_rows.reshape(rows, num_blocks, gguf_bytes)
        num_scales = 2 if block_format == "Q4_1" else 1
        scales = np.ascontiguousarray(gguf_blocks[:, :, : 2 * num_scales]).view(np.float16).astype(np.float32)
        kernel_blocks = np.concatenate([scales.view(np.uint8), gguf_blocks[:, :, 2 * num_scales :]], axis=2)
        return BlockWeight(block_format, torch.from_numpy(kernel_blocks.reshape(rows, -1)), cols)

    @staticmethod
    def concat(parts: "list[BlockWeight]") -> "BlockWeight":
        """Row-wise concatenation (fused q|k|v, gate|up); formats and widths must agree."""
        formats, widths = {p.format for p in parts}, {p.cols for p in parts}
        if len(formats) != 1 or len(widths) != 1:
            raise ValueError(f"cannot fuse block weights of formats {formats} and widths {widths}")
        return BlockWeight(parts[0].format, torch.cat([p.blocks for p in parts]), parts[0].cols)


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
        self._matvec(weight.data_ptr(), x.data_ptr(), out.data_ptr(), rows, cols, torch.get_num_threads())
        return out

    def matmul_blocks(self, x: Tensor, weight: BlockWeight) -> Tensor:
        """x (m, in) float32 @ weight^T -> (m, out)."""
        x = x.contiguous()
        if x.dim() != 2 or x.shape[1] != weight.cols or x.dtype != torch.float32:
            raise ValueError(f"matmul_blocks wants x (m, {weight.cols}) float32, got {tuple(x.shape)} {x.dtype}")
        out = torch.empty((x.shape[0], weight.rows), dtype=torch.float32)
        status = self._matmul_blocks(_FORMAT_CODES[weight.format], weight.blocks.data_ptr(), x.data_ptr(),
                                     out.data_ptr(), x.shape[0], weight.rows, weight.cols, torch.get_num_threads())
        if status:
            raise MemoryError("matmul_blocks: no memory for the accumulators of a column-tiled product")
        return out


def load(build_dir: Path, compiler: str | None = FIND_COMPILER, variant: str = "avx2") -> CpuMatvec:
    """Build (once, cached by source hash) and load the kernels (kernels.cpu_features variant, or
    the best below it they have); raises native_build.NativeUnavailable where they cannot run here."""
    return CpuMatvec(load_library("matvec", build_dir, compiler, variant))

"""The weight formats held in block form at run time: ONE table of each format's block size,
bytes and layout, which the loader, the C kernels' wrappers and their tests read.

A weight is a `BlockWeight(format, blocks, cols)`: `blocks` is (rows, bytes_per_row) uint8, one
output row per row (q/k rows already un-permuted from llama.cpp's rope order), each row
`cols / block_size` blocks back to back. A block's bytes are GGUF's own block struct
(ggml-common.h), except Q4_1, whose fp16 scales are widened (exactly) to float32 so a block's
scale is one broadcast load. Q8_0 keeps GGUF's 34-byte block (the kernels load its fp16 scale and
32 bytes unaligned): widened to 36 bytes it held 73 MiB more of a 1B model, read from memory at
every token, for one conversion a block that F16C does in an instruction. Values (`dequantize_reference` is the contract, gguf's own
`dequantize` of the GGUF bytes), with all integers little-endian, fp16 = IEEE half:

  Q4_0  32 / 18 B  {fp16 d, 16 B nibbles}: element j < 16 is the low nibble of byte j, j + 16
                   its high nibble; w = d * (q - 8)
  Q4_1  32 / 24 B  widened {f32 d, f32 m, 16 B nibbles} (GGUF: fp16 d, fp16 m, 20 B); w = d * q + m
  Q5_0  32 / 22 B  {fp16 d, u32 qh, 16 B nibbles}: nibbles as Q4_0, bit j of qh is element j's
                   fifth bit; w = d * (q - 16)
  Q5_1  32 / 24 B  {fp16 d, fp16 m, u32 qh, 16 B nibbles}; w = d * q + m
  Q8_0  32 / 34 B  {fp16 d, 32 int8}; w = d * q
  Q2_K 256 / 84 B  {16 B scales, 64 B qs, fp16 d, fp16 dmin}: 32-group g (0..7) holds 2-bit
                   values (qs[32 * (g / 4) + e] >> 2 * (g % 4)) & 3; element i's 16-group
                   s = i / 16 has scale byte scales[s]: w = d * (sc & 15) * q - dmin * (sc >> 4)
  Q3_K 256 / 110 B {32 B hmask, 64 B qs, 12 B scales, fp16 d}: low 2 bits as Q2_K, minus 4 where
                   bit g of hmask[e] is clear; 16 6-bit scales (low nibbles from bytes 0-7, i.e.
                   byte s % 8 >> 4 * (s / 8), high 2 bits from byte 8 + s % 4 >> 2 * (s / 4)),
                   offset by -32; w = d * scale * q
  Q4_K 256 / 144 B {fp16 d, fp16 dmin, 12 B scales, 128 B qs}: 32-group g is the nibble g % 2 of
                   qs[32 * (g / 2) + e]; 8 6-bit scales and mins packed as ggml's get_scale_min_k4;
                   w = d * sc[g] * q - dmin * m[g]
  Q5_K 256 / 176 B {fp16 d, fp16 dmin, 12 B scales, 32 B qh, 128 B qs}: as Q4_K plus a fifth bit,
                   bit g of qh[e]
  Q6_K 256 / 210 B {128 B ql, 64 B qh, 16 int8 scales, fp16 d}: 32-group g: half h = g / 4,
                   low 4 bits = nibble (g % 4) / 2 of ql[64 h + 32 (g % 2) + e], high 2 bits
                   (qh[32 h + e] >> 2 * (g % 4)) & 3, q - 32; 16-group scale; w = d * scale * q
  F16 / BF16 / F32  one value a "block" (2, 2, 4 B)

Every scale product in these formulas is exact in float32 (an fp16 times a small integer), so
a weight is one rounding of `d * q +- m`, the same float32 gguf's numpy `dequantize` computes;
the C kernels decode each weight to exactly that value (kernels/csrc/block_decode.h).
"""

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from torch import Tensor

KERNEL_GROUP = 32  # the C kernels decode and multiply 32 weights at a time: cols % 32 == 0


@dataclass(frozen=True)
class BlockFormat:
    name: str  # GGUF's type name
    code: int  # the C kernels' format code (kernels/csrc/block_decode.h, FORMAT_*)
    block_size: int  # weights per block along a row
    bytes: int  # bytes of one block as held at run time
    widened_scales: int = 0  # leading fp16 scales widened to float32 (Q4_1: 2); 0 = GGUF's struct

    @property
    def gguf_bytes(self) -> int:
        """Bytes of GGUF's own block struct (gguf's GGML_QUANT_SIZES)."""
        return GGML_QUANT_SIZES[GGMLQuantizationType[self.name]][1]

    @property
    def is_quantized(self) -> bool:
        return self.block_size > 1


FORMATS = {f.name: f for f in (
    BlockFormat("Q4_1", 0, 32, 24, widened_scales=2),
    BlockFormat("Q8_0", 1, 32, 34),
    BlockFormat("Q4_0", 2, 32, 18),
    BlockFormat("Q5_0", 3, 32, 22),
    BlockFormat("Q5_1", 4, 32, 24),
    BlockFormat("Q2_K", 5, 256, 84),
    BlockFormat("Q3_K", 6, 256, 110),
    BlockFormat("Q4_K", 7, 256, 144),
    BlockFormat("Q5_K", 8, 256, 176),
    BlockFormat("Q6_K", 9, 256, 210),
    BlockFormat("F16", 10, 1, 2),
    BlockFormat("BF16", 11, 1, 2),
    BlockFormat("F32", 12, 1, 4),
)}


def block_format(name: str) -> BlockFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown block format {name!r} (known: {', '.join(FORMATS)})")
    return FORMATS[name]


@dataclass(frozen=True)
class BlockWeight:
    """A (rows, cols) weight in one of FORMATS: `blocks` (rows, cols / block_size * bytes) uint8."""

    format: str
    blocks: Tensor
    cols: int

    def __post_init__(self):
        spec = block_format(self.format)
        expected = self.cols // spec.block_size * spec.bytes
        if (self.cols % KERNEL_GROUP or self.cols % spec.block_size or self.blocks.dtype != torch.uint8
                or self.blocks.dim() != 2 or self.blocks.shape[1] != expected or not self.blocks.is_contiguous()):
            raise ValueError(
                f"{self.format} weight with {self.cols} columns needs contiguous uint8 blocks (rows, {expected}) "
                f"and columns a multiple of {max(KERNEL_GROUP, spec.block_size)}, "
                f"got {self.blocks.dtype} {tuple(self.blocks.shape)}")

    @property
    def rows(self) -> int:
        return self.blocks.shape[0]

    @property
    def spec(self) -> BlockFormat:
        return FORMATS[self.format]

    @staticmethod
    def from_gguf(format_name: str, gguf_rows: np.ndarray, cols: int) -> "BlockWeight":
        """From GGUF's blocks, (rows, cols / block_size * gguf_bytes) uint8 (shared, not copied,
        where the format keeps GGUF's struct)."""
        spec = block_format(format_name)
        num_blocks = cols // spec.block_size
        if (cols % spec.block_size or gguf_rows.dtype != np.uint8 or gguf_rows.ndim != 2
                or gguf_rows.shape[1] != num_blocks * spec.gguf_bytes):
            raise ValueError(f"{format_name} weight with {cols} columns needs uint8 GGUF blocks "
                             f"(rows, {num_blocks * spec.gguf_bytes}), got {gguf_rows.dtype} {gguf_rows.shape}")
        rows = gguf_rows.shape[0]
        if not spec.widened_scales:
            return BlockWeight(format_name, torch.from_numpy(np.ascontiguousarray(gguf_rows)), cols)
        gguf_blocks = gguf_rows.reshape(rows, num_blocks, spec.gguf_bytes)
        scale_bytes = 2 * spec.widened_scales
        scales = np.ascontiguousarray(gguf_blocks[:, :, :scale_bytes]).view(np.float16).astype(np.float32)
        kernel_blocks = np.concatenate([scales.view(np.uint8), gguf_blocks[:, :, scale_bytes:]], axis=2)
        return BlockWeight(format_name, torch.from_numpy(kernel_blocks.reshape(rows, -1)), cols)

    def to_gguf(self) -> np.ndarray:
        """GGUF's blocks of the same values, (rows, bytes) uint8 (narrowing widened scales is exact)."""
        spec = self.spec
        rows_np = self.blocks.numpy()
        if not spec.widened_scales:
            return rows_np
        kernel_blocks = rows_np.reshape(self.rows, -1, spec.bytes)
        scale_bytes = 4 * spec.widened_scales
        scales = np.ascontiguousarray(kernel_blocks[:, :, :scale_bytes]).view(np.float32).astype(np.float16)
        return np.concatenate([scales.view(np.uint8), kernel_blocks[:, :, scale_bytes:]], axis=2).reshape(self.rows, -1)

    @staticmethod
    def concat(parts: "list[BlockWeight]") -> "BlockWeight":
        """Row-wise concatenation (fused q|k|v, gate|up); formats and widths must agree."""
        formats, widths = {p.format for p in parts}, {p.cols for p in parts}
        if len(formats) != 1 or len(widths) != 1:
            raise ValueError(f"cannot fuse block weights of formats {formats} and widths {widths}")
        return BlockWeight(parts[0].format, torch.cat([p.blocks for p in parts]), parts[0].cols)


def dequantize_reference(weight: BlockWeight) -> Tensor:
    """The weight's float32 values, (rows, cols), by gguf's own `dequantize` (the contract the
    C kernels are tested against; the torch backend's load-time path)."""
    values = dequantize(weight.to_gguf(), GGMLQuantizationType[weight.format])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(weight.rows, weight.cols))

"""The CPU backend's linear layers: over float32 weights, oneDNN's prepacked GEMM and a C kernel
for few rows (CpuLinear); over weights held only as blocks, C kernels for few rows and a tiled
GEMM over dequantized rows for more (BlockLinear); and the embedding table as blocks (BlockEmbedding).

Prefill's GEMM multiplies in `prefill_dtype`: float32, or bfloat16 where the CPU has native bf16
(kernels/cpu_features.py): then x and the weight (the packed copy, or each tile, which C dequantizes
straight to bf16) are rounded to bf16, oneDNN accumulates in float32 and rounds its output to bf16, and
the result comes back as float32 (torch's CPU matmul has no float32 output for bf16 inputs). The few-rows kernels are
float32 (or their own activations) either way.

oneDNN reorders the weight once into the blocked layout its GEMM reads
(kernels/packed_linear.py). Inputs of up to `few_rows_max` rows (decode) go to a C
kernel over the GGUF blocks of the weight, or over a row-major float32 copy
(kernels/cpu_matvec.py); where that limit lies is measured per weight shape at load
(crossover.py).
"""

from collections.abc import Callable

import torch
from torch import Tensor, nn

from kernels.packed_linear import packed_linear


class CpuLinear(nn.Module):
    """x (M, in) -> x @ W^T + bias (M, out), float32 in and out."""

    def __init__(self, packed_weight: Tensor, bias: Tensor | None, out_features: int,
                 few_rows: Callable[[Tensor], Tensor] | None = None, few_rows_max: int = 0,
                 prefill_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.packed_weight = packed_weight  # opaque oneDNN tensor of prefill_dtype
        self.prefill_dtype = prefill_dtype
        self.bias = bias
        self.out_features = out_features
        self.few_rows = few_rows  # x (m, in) -> x @ W^T (m, out), for m <= few_rows_max
        self.few_rows_max = few_rows_max if few_rows is not None else 0

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[0] <= self.few_rows_max:
            y = self.few_rows(x)
            return y + self.bias if self.bias is not None else y
        if self.prefill_dtype == torch.float32:
            return packed_linear(x, self.packed_weight, self.bias)
        y = packed_linear(x.to(self.prefill_dtype), self.packed_weight, None).float()
        return y + self.bias if self.bias is not None else y


# A prefill tile: this many weights dequantized at a time in prefill's dtype (4 MiB of float32, 2 MiB of
# bfloat16), then one GEMM over them (256K-2M weights measured alike: docs/performance.md, "An AMX machine").
TILE_WEIGHTS = 1 << 20


class BlockLinear(nn.Module):
    """x (M, in) -> x @ W^T + bias, W held only as blocks (kernels/block_formats.py): `parts`, the
    weight's rows in order (a fused projection whose parts differ in format has several).

    Up to `few_rows_max` rows (decode, verify chunks) a C kernel reads the blocks (`few_rows`, per
    part); more rows (prefill) dequantize a tile of rows at a time into a scratch buffer and run
    torch's GEMM on it, so no float32 copy of the weight is ever whole."""

    def __init__(self, parts: list, bias: Tensor | None, few_rows: Callable[[Tensor, object], Tensor],
                 dequantize_rows: Callable[..., Tensor], few_rows_max: int,
                 prefill_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.parts = parts  # BlockWeight, row-wise
        self.bias = bias
        self.out_features = sum(part.rows for part in parts)
        self.few_rows = few_rows  # (x (m, in), part) -> (m, part.rows)
        self.dequantize_rows = dequantize_rows  # (part, first=, count=, out=) -> (count, in) float32
        self.few_rows_max = few_rows_max
        self.prefill_dtype = prefill_dtype  # what the tiles and x are rounded to for the GEMM

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[0] <= self.few_rows_max:
            outputs = [self.few_rows(x, part) for part in self.parts]
        else:
            x_prefill = x.to(self.prefill_dtype).contiguous()  # once for every part
            outputs = [self._tiled(x_prefill, part) for part in self.parts]
        y = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        return y + self.bias if self.bias is not None else y

    def _tiled(self, x: Tensor, part) -> Tensor:
        """x (M, in) contiguous, of prefill_dtype -> (M, part.rows) float32."""
        tile_rows = max(1, min(part.rows, TILE_WEIGHTS // part.cols))
        tile = torch.empty((tile_rows, part.cols), dtype=x.dtype)  # dequantized straight to x's dtype by C
        out = torch.empty((x.shape[0], part.rows), dtype=torch.float32)
        for first in range(0, part.rows, tile_rows):
            count = min(tile_rows, part.rows - first)
            weights = self.dequantize_rows(part, first=first, count=count, out=tile[:count])
            out[:, first:first + count].copy_(torch.mm(x, weights.T))
        return out


class BlockEmbedding(nn.Module):
    """ids (...) -> (..., d): the looked-up rows of an embedding table held as blocks, dequantized."""

    def __init__(self, weight, dequantize_rows: Callable[..., Tensor]):
        super().__init__()
        self.table = weight  # BlockWeight (vocab, d)
        self.dequantize_rows = dequantize_rows

    def forward(self, ids: Tensor) -> Tensor:
        return self.dequantize_rows(self.table, row_ids=ids)

"""The CPU backend's linear layers: over float32 weights, oneDNN's prepacked GEMM and a C kernel
for few rows (CpuLinear); over weights held only as blocks, C kernels for few rows and a tiled
GEMM over dequantized rows for more (BlockLinear); and the embedding table as blocks (BlockEmbedding).

Prefill's GEMM multiplies as its PrefillMath says: in float32; in bf16 products inside float32 GEMMs
where oneDNN runs them (AMX: kernels/bf16_products.py), x and the weight (the packed copy, or each tile)
rounded to bf16 by oneDNN, float32 accumulation and output, a row's bits independent of the row count; or,
asked for where those do not run, over bf16 tensors (x and the weight rounded to bf16, each tile dequantized
by C straight to bf16), oneDNN rounding its output to bf16 before it comes back as float32 (torch's CPU
matmul has no float32 output for bf16 tensors). The few-rows kernels are float32 (or their own
activations) either way.

oneDNN reorders the weight once into the blocked layout its GEMM reads
(kernels/packed_linear.py). Inputs of up to `few_rows_max` rows (decode) go to a C
kernel over the GGUF blocks of the weight, or over a row-major float32 copy
(kernels/cpu_matvec.py); where that limit lies is measured per weight shape at load
(crossover.py). The backend may let the kernel serve more rows in groups of that limit
(`grouped_rows_max`: over tiles, and for a copy under bf16 products; model/backends/cpu_backend.py).
"""

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from kernels.amx_gemm import AmxGemm
from kernels.attention_inputs import AttentionInputs
from kernels.cpu_gemm_q8 import PackedBlocks
from kernels.bf16_products import bf16_products, padded_rows
from kernels.fma_gemm import FmaGemm
from kernels.packed_linear import packed_linear

# A GEMM over weights held as blocks, decoding its panels itself (the prefill math it multiplies in: its
# `products`): on AMX tiles in bf16 products (kernels/amx_gemm.py), or in float32 with FMA (kernels/fma_gemm.py).
BlocksGemm = AmxGemm | FmaGemm


@dataclass(frozen=True)
class PrefillMath:
    """How prefill's GEMMs multiply: `dtype` is what x and the weight copies or tiles are held in for the
    GEMM; `bf16_products`, float32 GEMMs with bf16 products (kernels/bf16_products.py)."""

    name: str  # said in describe(): "float32", "bfloat16 products", "bfloat16 tensors"
    dtype: torch.dtype = torch.float32
    bf16_products: bool = False

    def products(self) -> contextlib.AbstractContextManager:
        return bf16_products() if self.bf16_products else contextlib.nullcontext()


FLOAT32_MATH = PrefillMath("float32")
BF16_PRODUCTS_MATH = PrefillMath("bfloat16 products", torch.float32, bf16_products=True)
BF16_TENSORS_MATH = PrefillMath("bfloat16 tensors", torch.bfloat16)


class StepRows:
    """The running step's rows (`inputs`: its AttentionInputs, None between steps), set around each forward
    (CpuBackend.step) and read by the linear layers under bf16 products. A prompt row then always runs the
    prefill GEMM, whatever its chunk's size, so its bits do not depend on how the prompt was chunked or what
    was cached (the GEMM's rows do not depend on the row count); generated rows run float32's path by their
    own count (`PrefillLinear._by_count`), so a decode's bits do not depend on the prompts that shared its
    step. The row indices are the inputs' own, built once a step (AttentionInputs.prompt_rows)."""

    def __init__(self):
        self.inputs: AttentionInputs | None = None


class PrefillLinear(nn.Module):
    """x (M, in) -> x @ W^T + bias (M, out), float32 in and out: up to `few_rows_max` rows a few-rows
    kernel, up to `grouped_rows_max` that kernel over groups of few_rows_max rows (its rows do not depend on
    how many share a call, so neither do these), more a GEMM that multiplies as `prefill_math` says. Under
    bf16 products (`step_rows` given) by the step's rows where a step is running: prompt rows the GEMM at
    any count, generated rows float32's path by their count."""

    def __init__(self, bias: Tensor | None, out_features: int, few_rows_max: int, prefill_math: PrefillMath,
                 step_rows: StepRows | None, grouped_rows_max: int = 0):
        super().__init__()
        self.bias = bias
        self.out_features = out_features
        self.few_rows_max = few_rows_max
        self.kernel_rows_max = max(few_rows_max, grouped_rows_max) if few_rows_max else 0
        self.prefill_math = prefill_math
        self.step_rows = step_rows if prefill_math.bf16_products else None
        # (y, bias) -> y + bias; the cpu backend's C kernel adds in place (a recorded decode step holds it)
        self.add_bias: Callable[[Tensor, Tensor], Tensor] = torch.add

    def forward(self, x: Tensor) -> Tensor:
        step = self.step_rows.inputs if self.step_rows is not None else None
        if step is None or not step.num_generated or step.num_tokens != x.shape[0]:  # by the row count
            y = self._by_count(x, self.prefill_math)
        elif not step.prompt_rows.numel():
            y = self._by_count(x, FLOAT32_MATH)
        elif not step.generated_rows.numel():
            y = self._prefill_gemm(x, self.prefill_math)
        else:
            prompt, generated = step.prompt_rows, step.generated_rows
            y = x.new_empty((x.shape[0], self.out_features))
            y.index_copy_(0, generated, self._by_count(x.index_select(0, generated), FLOAT32_MATH))
            y.index_copy_(0, prompt, self._prefill_gemm(x.index_select(0, prompt), self.prefill_math))
        return self.add_bias(y, self.bias) if self.bias is not None else y

    def _prefill_gemm(self, x: Tensor, math: PrefillMath) -> Tensor:
        """The GEMM; under bf16 products over at least bf16_products.MIN_ROWS rows, so that a row's bits do
        not depend on the row count."""
        if not math.bf16_products:
            return self._gemm(x, math)
        return self._gemm(padded_rows(x), math)[:x.shape[0]]

    def _by_count(self, x: Tensor, math: PrefillMath) -> Tensor:
        rows, limit = x.shape[0], self.few_rows_max
        if rows > self.kernel_rows_max:
            return self._prefill_gemm(x, math)
        if rows <= limit:
            return self._few_rows(x)
        return torch.cat([self._few_rows(x[first:first + limit]) for first in range(0, rows, limit)])

    def _few_rows(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _gemm(self, x: Tensor, math: PrefillMath) -> Tensor:
        """x (M, in) float32 -> x @ W^T (M, out) float32, multiplied as `math` says."""
        raise NotImplementedError


class CpuLinear(PrefillLinear):
    """Over a oneDNN-packed weight (float32, or bfloat16 under bf16 tensors); `few_rows` for up to
    `few_rows_max` rows."""

    def __init__(self, packed_weight: Tensor, bias: Tensor | None, out_features: int,
                 few_rows: Callable[[Tensor], Tensor] | None = None, few_rows_max: int = 0,
                 prefill_math: PrefillMath = FLOAT32_MATH, step_rows: StepRows | None = None,
                 grouped_rows_max: int = 0):
        super().__init__(bias, out_features, few_rows_max if few_rows is not None else 0, prefill_math, step_rows,
                         grouped_rows_max)
        self.packed_weight = packed_weight  # opaque oneDNN tensor of prefill_math.dtype
        self.few_rows = few_rows  # x (m, in) -> x @ W^T (m, out), for m <= few_rows_max

    def _few_rows(self, x: Tensor) -> Tensor:
        return self.few_rows(x)

    def _gemm(self, x: Tensor, math: PrefillMath) -> Tensor:
        with math.products():
            return packed_linear(x.to(math.dtype), self.packed_weight, None).float()


# A prefill tile: this many weights dequantized at a time in prefill's dtype (8 MiB of float32, 4 MiB of
# bfloat16), then one GEMM over them. 256K-2M weights measured alike over bf16 tensors; with bf16 products
# oneDNN rounds x to bf16 in every GEMM, and 2M weights ran 1.0-1.9x 1M on 2048 x 8192 and 8192 x 2048
# weights at 512 and 2048 rows, 8M slower again (docs/performance.md, "bfloat16 products").
TILE_WEIGHTS = 1 << 21


class PrefillOutputs:
    """float32 buffers that the prefill GEMMs of a model's layers write their outputs into during a model
    forward, one per projection role (the name's last part: qkv_proj, o_proj, gate_up_proj, down_proj, ...),
    kept and grown to the largest step seen. Within a forward, a layer's output of a role is consumed before
    the next layer computes that role (the stream's next op reads it), so one buffer a role serves every
    layer; outside a forward (StepRows.inputs None) a call gets a fresh output, since its caller may hold it.
    Why: a fresh output of tens to hundreds of MiB is a fresh mapping from glibc, and writing it faulted in and
    zeroed every page (docs/performance.md, "Prefill outputs reused")."""

    def __init__(self):
        self._buffers: dict[str, Tensor] = {}

    def take(self, role: str, rows: int, cols: int) -> Tensor:
        """A (rows, cols) float32 view of role's buffer (its earlier contents are the caller's to overwrite)."""
        buffer = self._buffers.get(role)
        if buffer is None or buffer.numel() < rows * cols:
            buffer = self._buffers[role] = torch.empty(rows * cols)
        return buffer[:rows * cols].view(rows, cols)


class BlockLinear(PrefillLinear):
    """W held only as blocks (kernels/block_formats.py): `parts`, the weight's rows in order (a fused
    projection whose parts differ in format has several).

    Up to `few_rows_max` rows (decode, verify chunks) a C kernel reads the blocks (`few_rows`, per
    part); more rows (prefill) dequantize a tile of rows at a time into a scratch buffer and run
    torch's GEMM on it, so no float32 copy of the weight is ever whole."""

    def __init__(self, parts: list, bias: Tensor | None, few_rows: Callable[..., Tensor],
                 dequantize_rows: Callable[..., Tensor], few_rows_max: int,
                 prefill_math: PrefillMath = FLOAT32_MATH, step_rows: StepRows | None = None,
                 grouped_rows_max: int = 0, outputs: PrefillOutputs | None = None, role: str = "",
                 gemm: BlocksGemm | None = None, copy_of: Callable[..., PackedBlocks | None] | None = None):
        super().__init__(bias, sum(part.rows for part in parts), few_rows_max, prefill_math, step_rows,
                         grouped_rows_max)
        self.parts = parts  # BlockWeight, row-wise
        # the GEMM over the blocks in prefill's math, for the parts it supports (None: tiles)
        self.gemm = gemm
        self.copy_of = copy_of  # part -> its decode copy in interleaved rows, which the GEMM may read too (or None)
        # with step_rows: during a forward the GEMM's output is outputs.take(role, ...) (PrefillOutputs)
        self.outputs, self.role = outputs, role
        self.few_rows = few_rows  # (x (m, in), part, out=None) -> (m, part.rows), into `out` when given
        self.dequantize_rows = dequantize_rows  # (part, first=, count=, out=) -> (count, in) float32

    def _few_rows(self, x: Tensor) -> Tensor:
        return joined_products(x, self.parts, self.few_rows)

    def _gemm(self, x: Tensor, math: PrefillMath) -> Tensor:
        x_prefill = x.to(math.dtype).contiguous()  # once for every part
        in_forward = self.outputs is not None and self.step_rows is not None and self.step_rows.inputs is not None
        out = self.outputs.take(self.role, x.shape[0], self.out_features) if in_forward else None
        if self.gemm is not None and math == self.prefill_math:
            packed = self.gemm.pack(x_prefill)  # x as the GEMM reads it (AMX: bf16), once for every part
            return joined_products(x_prefill, self.parts, functools.partial(self._on_gemm, packed, math), out)
        with math.products():
            return joined_products(x_prefill, self.parts, self._tiled, out)

    def _on_gemm(self, packed, math: PrefillMath, x: Tensor, part, out: Tensor | None = None) -> Tensor:
        """The GEMM's product of a part, over its interleaved copy where it has one (faster to decode, the same
        bits), else over its blocks; the tiles' for a part it does not support (`supports`)."""
        copy = self.copy_of(part) if self.copy_of is not None else None
        if copy is not None and self.gemm.reads(copy):
            return self.gemm.matmul_interleaved(packed, copy, out)
        if self.gemm.supports(part):
            return self.gemm.matmul(packed, part, out)
        with math.products():
            return self._tiled(x, part, out)

    def _tiled(self, x: Tensor, part, out: Tensor | None = None) -> Tensor:
        """x (M, in) contiguous, of the tiles' dtype -> (M, part.rows) float32 (into `out` when given)."""
        tile_rows = max(1, min(part.rows, TILE_WEIGHTS // part.cols))
        tile = torch.empty((tile_rows, part.cols), dtype=x.dtype)  # dequantized straight to x's dtype by C
        float_product = x.dtype == torch.float32  # else bf16 tensors, whose product is bf16: copied into float32
        if out is None:
            out = torch.empty((x.shape[0], part.rows), dtype=torch.float32)
        for first in range(0, part.rows, tile_rows):
            count = min(tile_rows, part.rows - first)
            weights = self.dequantize_rows(part, first=first, count=count, out=tile[:count])
            if float_product:  # written in place: the same bits as a copy of its product, ~18% faster
                torch.mm(x, weights.T, out=out[:, first:first + count])
            else:
                into(out[:, first:first + count], torch.mm(x, weights.T))
        return out


def prefill_over_blocks(formats: str, parts: list, math_note: str, gemm: BlocksGemm | None,
                        copy_of: Callable[..., PackedBlocks | None]) -> str:
    """What a BlockLinear's prefill GEMM runs, as describe() says it."""
    tiles = f"torch GEMM over dequantized tiles of {formats} blocks{math_note}"
    if gemm is None:
        return tiles
    copied = [part.format for part in parts if (copy := copy_of(part)) is not None and gemm.reads(copy)]
    on_tiles = [part.rows for part in parts if not gemm.supports(part)]
    return (f"{gemm.label} over {formats} blocks ({gemm.products}"
            + (f"; {'+'.join(copied)} panels from the decode copy" if copied else "") + ")"
            + (f", parts of {'/'.join(map(str, on_tiles))} rows (not multiples of {gemm.row_multiple}) as {tiles}"
               if on_tiles else ""))


def into(out: Tensor | None, result: Tensor) -> Tensor:
    """result, copied into `out` when one is given (a product whose kernel has no output argument)."""
    return result if out is None else out.copy_(result)


def joined_products(x: Tensor, parts: list, product: Callable[..., Tensor], out: Tensor | None = None) -> Tensor:
    """x (m, in) @ W^T -> (m, out) for a weight held as row-wise `parts` (into `out` when given): `product(x,
    part, out)` writes each part's product into its columns of one output, so nothing is concatenated after
    (and a decode step stays recordable: model/backends/decode_programs.py)."""
    if len(parts) == 1:
        return product(x, parts[0], out)
    if out is None:
        out = torch.empty(x.shape[0], sum(part.rows for part in parts))
    first = 0
    for part in parts:
        product(x, part, out[:, first:first + part.rows])
        first += part.rows
    return out


class BlockEmbedding(nn.Module):
    """ids (...) -> (..., d): the looked-up rows of an embedding table held as blocks, dequantized."""

    def __init__(self, weight, dequantize_rows: Callable[..., Tensor]):
        super().__init__()
        self.table = weight  # BlockWeight (vocab, d)
        self.dequantize_rows = dequantize_rows

    def forward(self, ids: Tensor) -> Tensor:
        return self.dequantize_rows(self.table, row_ids=ids)

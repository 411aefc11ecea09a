"""`cpu`: CPU float32 on oneDNN's prepacked GEMMs, C kernels for few-row products
(float32 or GGUF blocks) and fused C ops for the small ops of a step.

What a machine gets depends on what loaded, and describe() says which and why (and which
instruction sets the CPU has, and which kernel variant was built: kernels/cpu_features.py):
- with int8 activations (gemm_q8): products over weights held as Q4_0, Q4_1, Q8_0 or Q4_K blocks,
  prefill and decode alike, as int8 GEMMs with activations quantized per block of 32
  (kernels/cpu_gemm_q8.py: AVX-512 VNNI or AVX2), the blocks repacked at load; other formats, and
  every weight without it, as below;
- weights held as GGUF blocks: decode over the blocks (C kernels), with int16 activations (the default) the
  Q4_1 / Q4_K projections over a copy repacked into interleaved rows where it fits in its budget
  (model/backends/decode_copies.py); prefill over a copy of the
  projections in prefill's dtype when it fits in `float_prefill_max_bytes` (a small model), else a GEMM over the
  blocks that decodes its own panels (AMX under bf16 products, FMA in float32 with the avx2 kernels:
  model/backends/cpu_linear.py's BlocksGemm), else a tiled GEMM over rows dequantized on the fly (no copy of a
  weight is ever whole). Prefill's dtype is float32,
  or bfloat16 where the CPU has native bf16 and it is asked for or measured faster (kernels/cpu_features.py,
  resolve_prefill_dtype): bf16 products inside float32 GEMMs where oneDNN runs them (AMX), else bf16
  tensors (model/backends/cpu_linear.py, PrefillMath, says how each rounds);
- oneDNN prepacked linear layers always (kernels/packed_linear.py);
- with the C kernels built (kernels/native_build.py: a C compiler, AVX2/FMA/F16C):
  few-row products read the GGUF blocks of a converted model (or, without blocks, a kept
  row-major float32 copy for single rows: twice the weight memory), up to a row count
  measured per weight shape at load (crossover.py); RMSNorm, residual add + RMSNorm,
  RoPE + KV store, SwiGLU / GeGLU, decode attention (sliding windows and soft caps included) and the re-rotated store of document KV run as fused C kernels
  (kernels/cpu_decode_ops.py), decode attention in one call that reads the pages itself;
- prefill attention (every prefill of a step, sliding windows and soft caps included) in one call of a
  C kernel that reads the pages itself (kernels/cpu_prefill_attention.py: AVX-512, AVX2 or portable
  build, whichever this CPU runs), where a C compiler is there and the model's heads fit its limits;
  else torch's SDPA over gathered K/V (kernels/paged_attention.py), said in describe()'s fallbacks;
- without them (no compiler), the same oneDNN GEMMs with the torch ops around them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import functools
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from kernels.attention_inputs import AttentionInputs
from kernels.attention_plan import AttentionPolicy
from kernels.cpu_decode_ops import CpuDecodeOps
from kernels.amx_gemm import AmxGemm
from kernels.fma_gemm import FmaGemm
from kernels.cpu_gemm_q8 import CpuGemmQ8
from kernels.cpu_prefill_attention import CpuPrefillAttention
from kernels.block_formats import BlockWeight
from kernels.block_matmul import BlockKernels
from kernels.cpu_matvec import BLOCKS_MAX_ROWS, MATVEC_FORMATS, CpuMatvec
from kernels.native_build import NativeUnavailable, openmp_waits
from kernels.packed_linear import pack_weight, packed_linear
from kernels.paged_attention import paged_attention
from model.backends.base import BackendPlan, LayersFn, LinearPlan, StepPolicy
from model.backends.cpu_linear import (FLOAT32_MATH, BlockEmbedding, BlockLinear, BlocksGemm, CpuLinear, PrefillLinear,
                                      PrefillMath, PrefillOutputs, StepRows, into, joined_products,
                                      prefill_over_blocks)
from model.backends.crossover import measure_crossover
from model.backends.cpu_row_limits import (BLOCK_KERNEL_MAX_ROWS, CPU_VERIFY_ROW_COSTS, FIXED, MATVEC_F32_MAX_ROWS,
                                           MAX_VERIFY_ROWS_AS_DECODE, MEASURE, grouped_rows_max)
from model.backends.decode_copies import DecodeCopies
from model.backends.decode_programs import DecodePrograms
from model.backends.torch_backend import TorchBackend

from model.backends.cpu_defaults import (BF16_FLOAT_LAYERS, DECODE_ACTIVATIONS, FLOAT_PREFILL_MAX_BYTES,
                                         INT8_FLOAT_ACTIVATION_LAYERS, KEPT_OUTPUT_MIN_ROWS)

__all__ = ["BF16_FLOAT_LAYERS", "DECODE_ACTIVATIONS", "FLOAT_PREFILL_MAX_BYTES", "INT8_FLOAT_ACTIVATION_LAYERS",
           "KEPT_OUTPUT_MIN_ROWS", "CpuBackend"]


class CpuBackend(TorchBackend):
    name = "cpu"

    def __init__(self, matvec: CpuMatvec | None, ops: CpuDecodeOps | None, fallbacks: tuple[str, ...] = (),
                 crossover: str = FIXED, load_block_kernels: Callable[[], BlockKernels] | None = None,
                 gemm_q8: CpuGemmQ8 | None = None, instruction_sets: str = "",
                 float_activation_layers: tuple[str, ...] = INT8_FLOAT_ACTIVATION_LAYERS,
                 float_prefill_max_bytes: int = FLOAT_PREFILL_MAX_BYTES,
                 decode_activations: str = "int16", prefill_math: PrefillMath = FLOAT32_MATH,
                 bf16_float_layers: tuple[str, ...] = BF16_FLOAT_LAYERS,
                 prefill_attention: CpuPrefillAttention | None = None,
                 bf16_prefill_attention: CpuPrefillAttention | None = None,
                 interleaved: CpuGemmQ8 | None = None, decode_copy_max_bytes: int | None = None,
                 amx_gemm: AmxGemm | None = None, fma_gemm: FmaGemm | None = None):
        super().__init__(torch.device("cpu"), torch.float32, fallbacks)
        # how prefill's GEMMs over GGUF blocks multiply (resolved: kernels.cpu_features.resolve_prefill_dtype,
        # then model.backends._make_cpu)
        self.prefill_math = prefill_math
        self.step_rows = StepRows()  # the running step's prompt and generated rows (read under bf16 products)
        self.bf16_float_layers = bf16_float_layers  # with bfloat16 prefill, these stay float32 (last name part)
        if crossover not in (MEASURE, FIXED):
            raise ValueError(f"crossover must be {MEASURE!r} or {FIXED!r}, got {crossover!r}")
        if decode_activations not in DECODE_ACTIVATIONS:
            raise ValueError(f"decode activations must be one of {', '.join(DECODE_ACTIVATIONS)}, "
                             f"got {decode_activations!r}")
        self.decode_activations = decode_activations
        self.matvec = matvec
        self.ops = ops
        self.prefill_attention = prefill_attention  # the C prefill attention kernel; None: SDPA
        # its AMX build in bf16: what prefill_attention becomes for a model whose projections prefill over blocks
        # in bf16 products (prepare); a float32 model's GEMMs stay float32, so does its attention
        self.bf16_prefill_attention = bf16_prefill_attention
        # Weights kept as blocks need the block kernels (any CPU with a C compiler: the portable
        # build where AVX2 is missing); without them the loader dequantizes the blocks at load.
        # Built and loaded when a model first has blocks (a float32 model never pays the build).
        self._load_block_kernels = load_block_kernels
        self.gemm_q8 = gemm_q8  # products over blocks with int8 activations (every row count); None: off
        # int16 decode over copies repacked into interleaved rows (the same library; None: over the blocks)
        self.decode_copies = DecodeCopies(interleaved, decode_copy_max_bytes)
        # prefill GEMMs over blocks that decode their panels themselves (None: over dequantized tiles): on AMX tiles
        # under bf16 products (like the tiles'), with FMA in float32 (blocks_gemm: which a projection gets)
        self.amx_gemm = amx_gemm if prefill_math.bf16_products else None
        self.fma_gemm = fma_gemm
        # with gemm_q8, the projections (last name part) that keep float activations (quality: docs/performance.md)
        self.float_activation_layers = float_activation_layers
        self.instruction_sets = instruction_sets  # the CPU's, and the kernel variant chosen
        self._block_kernels: BlockKernels | None = None
        self._resident: dict[str, int] = {}  # block format -> bytes held as blocks
        self.prefill_outputs = PrefillOutputs()  # the layers' prefill GEMM outputs during a forward, a buffer a role
        self._embedding_table: BlockWeight | None = None  # the embedding's blocks (a tied LM head shares them)
        self._embedding = ""  # what the embedding runs, when it is blocks
        self.float_prefill_max_bytes = float_prefill_max_bytes
        self._float_prefill_bytes = 0  # the prefill copies made, in prefill_dtype (0: prefill over blocks)
        self._float_prefill = False  # decided per model in prepare
        self.crossover = crossover
        self._crossovers: dict[tuple, int] = {}  # (weight kind, out, in) -> measured few_rows_max
        self.policy = StepPolicy(self.policy.max_num_batched_tokens,
                                 AttentionPolicy(self.policy.attention.decode_token_budget,
                                                 self.policy.attention.prefill_block_rows,
                                                 fused_decode=ops is not None,
                                                 max_rows_as_decode=MAX_VERIFY_ROWS_AS_DECODE,
                                                 fused_prefill=prefill_attention is not None,
                                                 # under bf16 products prompt rows run as prefill (StepRows)
                                                 prompts_as_prefill=(prefill_math.bf16_products
                                                                     and prefill_attention is not None)),
                                 verify_row_costs=CPU_VERIFY_ROW_COSTS,
                                 max_verify_rows_per_step=BLOCKS_MAX_ROWS["Q4_1"])
        if ops is not None:  # chosen once: the fused kernels replace the torch ops
            self.rms_norm = self._fused_rms_norm
            self.add_rms_norm = self._fused_add_rms_norm
            self.rope_store_kv = self._fused_rope_store_kv
            self.qk_norm = ops.qk_norm  # in place
            # one C call per layer on the calling thread for a span (far faster than torch's ops here:
            # docs/performance.md, Document KV reuse)
            self.store_rerotated_kv = ops.rerotate_store_kv
            self.silu_and_mul = functools.partial(self._gated, ops.silu_and_mul)
            self.gelu_tanh_and_mul = functools.partial(self._gated, ops.gelu_tanh_and_mul)
        # plain decode steps recorded per batch size and replayed in one C call (decode_programs.py)
        self.decode_programs = DecodePrograms(ops.run_program) if ops is not None else None

    def _gated(self, kernel: Callable[..., Tensor], gate_up: Tensor) -> Tensor:
        """A gated activation's C kernel, writing a prompt chunk's output into a buffer kept for it during a
        forward (PrefillOutputs, role "gated": the down projection reads it before the next layer writes it)."""
        rows = gate_up.numel() // gate_up.shape[-1]
        if self.step_rows.inputs is None or rows < KEPT_OUTPUT_MIN_ROWS or gate_up.dim() != 2:
            return kernel(gate_up)
        return kernel(gate_up, self.prefill_outputs.take("gated", rows, gate_up.shape[-1] // 2))

    # ------------------------------------------------------------ load time

    @property
    def block_kernels(self) -> BlockKernels | None:
        if self._load_block_kernels is not None:
            load, self._load_block_kernels = self._load_block_kernels, None
            try:
                self._block_kernels = load()
                if self._block_kernels.instruction_set == "portable":
                    self.fallbacks += ("block kernels: the portable build (no AVX2/FMA/F16C here, or "
                                       "portable kernels asked for)",)
            except NativeUnavailable as error:
                self.fallbacks += (f"block kernels off ({error}): GGUF blocks dequantized to float32 at load",)
        return self._block_kernels

    @property
    def reads_blocks(self) -> bool:
        return self.block_kernels is not None

    def make_embedding(self, layer: nn.Module, blocks: list[BlockWeight]) -> nn.Module:
        (table,) = blocks
        self._count_resident(blocks)
        self._embedding_table = table
        self._embedding = f"{table.format} blocks, looked-up rows dequantized by C ({self.block_kernels.instruction_set})"
        return BlockEmbedding(table, self.block_kernels.dequantize_rows)

    def _count_resident(self, parts: list[BlockWeight]) -> None:
        for part in parts:
            self._resident[part.format] = self._resident.get(part.format, 0) + part.blocks.numel()

    def _few_rows_over_blocks(self, x: Tensor, part: BlockWeight, out: Tensor | None = None) -> Tensor:
        """x @ part^T, into `out` (columns of a fused projection's output) when given."""
        if self.decode_activations == "int16":
            over_copy = self.decode_copies.product(x, part, out)
            if over_copy is not None:
                return over_copy
            return self.block_kernels.matmul_q16(x, part, out)  # every format (float ones run float32)
        if self.matvec is not None and part.format in MATVEC_FORMATS:
            return into(out, self.matvec.matmul_blocks(x, part))  # the tuned Q4_1 / Q8_0 kernel (csrc/matvec.c)
        return self.block_kernels.matmul(x, part, out)

    def _make_block_linear(self, name: str, layer: nn.Module, parts: list[BlockWeight]) -> nn.Module:
        out_features, in_features = layer.weight.shape  # (the weight itself is unfilled: never touched)
        if sum(p.rows for p in parts) != out_features or any(p.cols != in_features for p in parts):
            raise ValueError(f"{name}: block weights {[(p.rows, p.cols) for p in parts]} do not fit a "
                             f"({out_features}, {in_features}) projection")
        if name != "lm_head" or not self._embedding_shares(parts):
            self._count_resident(parts)
        formats = "+".join(p.format for p in parts)
        if (self.gemm_q8 is not None and all(self.gemm_q8.fits(p) for p in parts)
                and name.rsplit(".", 1)[-1] not in self.float_activation_layers):
            # The blocks, repacked, serve every row count: one kernel, no float32 tile. At one row the int8
            # kernel took a quarter of the float-activation blocks kernel's time (576x1536 Q4_1: 16 vs 65 us,
            # one core), so decode runs on it too; a row's result does not depend on m.
            packed = [self.gemm_q8.repack(p) for p in parts]
            self._linears[name] = LinearPlan(f"int8 GEMM over {formats} blocks ({self.gemm_q8.variant})")
            return BlockLinear(packed, layer.bias, self._int8_product, self.block_kernels.dequantize_rows, sys.maxsize)
        tuned = self.matvec is not None and all(p.format in MATVEC_FORMATS for p in parts)
        if self.decode_activations == "int16":
            kernel = (self.decode_copies.copy(parts)
                      or f"C block matmul, int16 activations ({self.block_kernels.instruction_set})")
        else:
            kernel = "C matvec" if tuned else f"C block matmul ({self.block_kernels.instruction_set})"
        limit = min(BLOCKS_MAX_ROWS.get(p.format, BLOCK_KERNEL_MAX_ROWS) for p in parts)
        math = self._prefill_math_of(name)
        math_note = "" if math == FLOAT32_MATH else f" ({math.name})"
        if limit < self.policy.max_verify_rows_per_step:
            self.policy = dataclasses.replace(self.policy, max_verify_rows_per_step=limit)
        # over tiles the GEMM dequantizes the whole weight at every call; the FMA GEMM decodes its panels in L2 and
        # beat the few-rows kernels in groups from 9 rows (docs/performance.md, "Prefill over blocks with FMA")
        gemm = self.blocks_gemm(math)
        over_tiles = not self._float_prefill and (gemm is None or gemm is not self.fma_gemm)
        grouped = grouped_rows_max(limit, over_tiles, self.prefill_math.bf16_products)
        few_rows = f"{kernel} over {formats} blocks" + (f" (in groups of {limit} rows)" if grouped > limit else "")
        if self._float_prefill:
            return self._float_copy_over_blocks(name, layer, parts, formats, few_rows, limit, grouped)
        parts = self.decode_copies.release_planned(name, parts, self._resident)  # those plan() chose: _releases_blocks
        self._linears[name] = LinearPlan(prefill_over_blocks(formats, parts, math_note, gemm, self.decode_copies.copy_of),
                                         few_rows, grouped)
        in_layers = name.startswith("layers.")  # the LM head's logits leave the model: a fresh output each
        return BlockLinear(parts, layer.bias, self._few_rows_over_blocks, self.block_kernels.dequantize_rows, limit,
                           math, self.step_rows, grouped, self.prefill_outputs if in_layers else None,
                           name.rsplit(".", 1)[-1], gemm, self.decode_copies.copy_of)

    def blocks_gemm(self, math: PrefillMath) -> BlocksGemm | None:
        """The GEMM over blocks that multiplies as `math` says, where one is loaded (None: dequantized tiles)."""
        if math.bf16_products:
            return self.amx_gemm
        return self.fma_gemm if math == FLOAT32_MATH else None

    @property
    def prefill_dtype(self) -> str:
        """The resolved prefill dtype: "float32" or "bfloat16" (kernels.cpu_features.PREFILL_DTYPES)."""
        return "float32" if self.prefill_math == FLOAT32_MATH else "bfloat16"

    def _prefill_math_of(self, name: str) -> PrefillMath:
        return FLOAT32_MATH if name.rsplit(".", 1)[-1] in self.bf16_float_layers else self.prefill_math

    def prepare(self, model: nn.Module, blocks: dict[str, list]) -> None:
        projection_bytes = sum(self._prefill_math_of(name).dtype.itemsize * part.rows * part.cols
                               for name, parts in blocks.items() if name != "embed_tokens" for part in parts)
        self._float_prefill = 0 < projection_bytes <= self.float_prefill_max_bytes
        over_budget = self.decode_copies.plan(blocks, self.decode_activations == "int16",
                                              functools.partial(self._releases_blocks, blocks.get("embed_tokens", ())))
        if over_budget:
            self.fallbacks += (over_budget,)
        if self.bf16_prefill_attention is not None and self.prefill_math.bf16_products and projection_bytes:
            self.prefill_attention = self.bf16_prefill_attention
        super().prepare(model, blocks)
        if self.ops is not None:
            for module in model.modules():
                if isinstance(module, PrefillLinear) and module.bias is not None:
                    module.add_bias = self.ops.add_bias

    def _float_copy_over_blocks(self, name: str, layer: nn.Module, parts: list[BlockWeight], formats: str,
                                few_rows: str, limit: int, grouped: int) -> nn.Module:
        """oneDNN over a copy in prefill's dtype for more than `grouped` rows; the blocks for up to `grouped`
        (decode), in groups of `limit`."""
        math = self._prefill_math_of(name)
        dtype = math.dtype
        weight = torch.cat([self.block_kernels.dequantize_rows(part, first=0, count=part.rows).to(dtype)
                            for part in parts])
        self._float_prefill_bytes += weight.numel() * weight.element_size()
        self._linears[name] = LinearPlan(f"oneDNN prepacked over a {str(dtype).removeprefix('torch.')} copy of {formats} blocks"
                                         + ("" if math == FLOAT32_MATH else f" ({math.name})"), few_rows, grouped)
        return CpuLinear(pack_weight(weight), layer.bias, weight.shape[0],
                         functools.partial(self._few_rows_over_parts, parts=parts), limit, math, self.step_rows, grouped)

    def _few_rows_over_parts(self, x: Tensor, parts: list[BlockWeight]) -> Tensor:
        return joined_products(x, parts, self._few_rows_over_blocks)

    def _int8_product(self, x: Tensor, part, out: Tensor | None = None) -> Tensor:
        return into(out, self.gemm_q8(x, part))

    def _releases_blocks(self, embedding: list[BlockWeight], name: str, part: BlockWeight) -> bool:
        """Whether this part of projection `name` is held as its decode copy alone (DecodeCopies.release_planned):
        float32 prefill on the FMA GEMM serves every row count past the few-rows kernels and reads the copy, so
        nothing reads the blocks; not the embedding's table (its rows are looked up from the blocks), nor under bf16
        products (a decode batch past 16 rows runs float32 tiles over the blocks) or a float32 copy for prefill."""
        return (not self._float_prefill and self.fma_gemm is not None
                and self.blocks_gemm(self._prefill_math_of(name)) is self.fma_gemm
                and not any(part is table for table in embedding) and self.fma_gemm.reads_copy_of(part))

    def _embedding_shares(self, parts: list[BlockWeight]) -> bool:
        return self._embedding_table is not None and parts[0] is self._embedding_table

    def make_linear(self, name: str, layer: nn.Module, blocks: list[BlockWeight] | None) -> nn.Module:
        if blocks is not None:
            return self._make_block_linear(name, layer, blocks)
        weight, bias = layer.weight, layer.bias
        out_features, in_features = weight.shape
        packed = pack_weight(weight)
        few_rows, limit, kind = None, 0, ""
        if self.matvec is not None and self.matvec.fits(weight):
            few_rows = functools.partial(self.matvec, weight=weight)  # keeps the row-major copy
            kind, limit = "float32 row-major", MATVEC_F32_MAX_ROWS
        if few_rows is not None and self.crossover == MEASURE:
            key = (kind, out_features, in_features)
            if key not in self._crossovers:
                self._crossovers[key] = measure_crossover(
                    few_rows, functools.partial(packed_linear, packed_weight=packed, bias=None), in_features, limit)
            limit = self._crossovers[key]
        self._linears[name] = LinearPlan("oneDNN prepacked", f"C matvec over {kind}" if limit else "", limit)
        return CpuLinear(packed, bias, out_features, few_rows if limit else None, limit)

    def step(self, attn: AttentionInputs) -> contextlib.AbstractContextManager:
        # only bf16 products read the step's rows (StepRows)
        return self._rows_of(attn) if self.prefill_math.bf16_products else contextlib.nullcontext()

    @contextlib.contextmanager
    def _rows_of(self, attn: AttentionInputs) -> Iterator[None]:
        self.step_rows.inputs = attn
        try:
            yield
        finally:
            self.step_rows.inputs = None

    def run_layers(self, layers: LayersFn, hidden: Tensor, ropes: list[tuple[Tensor, Tensor]], kv_caches: list,
                   attn: AttentionInputs) -> Tensor:
        if self.decode_programs is None:
            return layers(hidden, ropes, kv_caches, attn)
        return self.decode_programs.run(layers, hidden, ropes, kv_caches, attn)

    def plan(self) -> BackendPlan:
        notes = (f"cpu: {self.instruction_sets}",) if self.instruction_sets else ()
        notes += (openmp_waits(),)
        if any(self._resident.values()):
            notes += ("weights resident as blocks: " + ", ".join(
                f"{fmt} {size / 2**20:.0f} MiB" for fmt, size in sorted(self._resident.items()) if size),)
        notes += tuple(filter(None, (self.decode_copies.note(),)))
        if self._float_prefill_bytes:
            notes += (f"prefill over {str(self.prefill_math.dtype).removeprefix('torch.')} copies of the projections, "
                      f"{self._float_prefill_bytes / 2**20:.0f} MiB (they fit in "
                      f"{self.float_prefill_max_bytes / 2**20:.0f} MiB)",)
        if self.prefill_math != FLOAT32_MATH:
            rounding = ("float32 accumulation and output; a row's bits do not depend on the row count"
                        if self.prefill_math.bf16_products else "float32 accumulation, output rounded to bf16")
            notes += (f"prefill GEMMs over blocks in {self.prefill_math.name} (x and weights rounded to bf16, "
                      f"{rounding})" + (f", but {'/'.join(self.bf16_float_layers)} in float32"
                                        if self.bf16_float_layers else ""),)
        if self._embedding:
            notes += (f"embedding: {self._embedding}",)
        if self._crossovers:
            notes += ("measured few-rows limits " + ", ".join(
                f"{kind} ({rows}x{cols}): {limit}" for (kind, rows, cols), limit in sorted(self._crossovers.items())),)
        if self.decode_programs is not None:
            notes += (f"decode steps of up to {self.decode_programs.max_batch} sequences recorded once per batch size "
                      "and replayed in one C call",)
        notes += self.weight_notes
        return BackendPlan(
            self.name, "cpu", "float32", dict(self._linears),
            row_ops="fused C kernels" if self.ops is not None else "torch ops",
            decode_attention=("fused C kernel over pages" if self.ops is not None
                              else "SDPA in length-sorted chunks"),
            prefill_attention=(f"C kernel over pages ({self.prefill_attention.describe()})"
                               if self.prefill_attention is not None else "SDPA over gathered K/V"),
            fallbacks=self.fallbacks, notes=notes)

    # ------------------------------------------------------------ fused ops

    def _fused_rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return self.ops.rms_norm(x, weight, eps)

    def _fused_add_rms_norm(self, residual: Tensor, x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        return self.ops.add_rms_norm(residual, x, weight, eps), residual  # residual updated in place

    def _fused_rope_store_kv(self, qkv: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                             slot_ids: Tensor, num_heads: int) -> Tensor:
        # rotates q and k in place in qkv, then writes k and v into their slots
        self.ops.rope_store_kv(qkv, cos, sin, k_cache, v_cache, slot_ids)
        return qkv[:, :num_heads]  # (N, H, D), a strided view

    def attention(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, attn: AttentionInputs,
                  scale: float, *, window: int | None = None, softcap: float | None = None) -> Tensor:
        return paged_attention(q, k_cache, v_cache, attn, scale, self.policy.attention, self.ops, window=window,
                               softcap=softcap, prefill_ops=self.prefill_attention)

"""`cpu`: CPU float32 on oneDNN's prepacked GEMMs, C kernels for few-row products
(float32 or GGUF blocks) and fused C ops for the small ops of a step.

What a machine gets depends on what loaded, and describe() says which and why:
- oneDNN prepacked linear layers always (kernels/packed_linear.py);
- with the C kernels built (kernels/native_build.py: a C compiler, AVX2/FMA/F16C):
  few-row products read the GGUF blocks of a converted model (or, without blocks, a kept
  row-major float32 copy for single rows: twice the weight memory), up to a row count
  measured per weight shape at load (crossover.py); RMSNorm, residual add + RMSNorm,
  RoPE + KV store, SwiGLU / GeGLU, decode attention (sliding windows and soft caps included) and the re-rotated store of document KV run as fused C kernels
  (kernels/cpu_decode_ops.py), decode attention in one call that reads the pages itself;
- without them (no compiler), the same oneDNN GEMMs with the torch ops around them.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import Tensor, nn

from kernels.attention_inputs import AttentionInputs
from kernels.attention_plan import AttentionPolicy
from kernels.cpu_decode_ops import CpuDecodeOps
from kernels.cpu_matvec import BLOCKS_MAX_ROWS, BlockWeight, CpuMatvec
from kernels.packed_linear import pack_weight, packed_linear
from kernels.paged_attention import paged_attention
from model.backends.base import BackendPlan, LinearPlan, StepPolicy
from model.backends.cpu_linear import CpuLinear
from model.backends.crossover import CANDIDATE_ROWS, measure_crossover
from model.backends.torch_backend import TorchBackend

MEASURE = "measure"  # few-rows limits timed per weight shape at load
FIXED = "fixed"  # the limits of kernels.cpu_matvec.BLOCKS_MAX_ROWS (and 1 row for float32)
MATVEC_F32_MAX_ROWS = 1  # the float32 matvec kernel takes one row
# A speculative verify chunk (a decode's last token + its drafts) of at most this many rows runs its
# attention in the fused decode kernel, one row per token (kernels/attention_plan.py).
MAX_VERIFY_ROWS_AS_DECODE = 16
# A step of one sequence's 1..8 rows after a 600-token prefix, relative to 1 row (SmolLM2 over GGUF blocks, one
# thread, CPU time, `python -m bench.verify_row_costs --repeats 25`, the mean of 3 runs' best of 25, 2026-12-01,
# with matmul_blocks prefetching the weight rows ahead): the blocks kernels decode each weight block once for all
# rows, but their multiply-adds grow with the rows, and so does attention (each row scores the whole context; the
# rows of a chunk read it in one pass).
CPU_VERIFY_ROW_COSTS = (1.0, 1.22, 1.47, 1.71, 1.92, 2.14, 2.35, 2.58)


class CpuBackend(TorchBackend):
    name = "cpu"

    def __init__(self, matvec: CpuMatvec | None, ops: CpuDecodeOps | None, fallbacks: tuple[str, ...] = (),
                 crossover: str = MEASURE):
        super().__init__(torch.device("cpu"), torch.float32, fallbacks)
        if crossover not in (MEASURE, FIXED):
            raise ValueError(f"crossover must be {MEASURE!r} or {FIXED!r}, got {crossover!r}")
        self.matvec = matvec
        self.ops = ops
        self.reads_blocks = matvec is not None
        self.crossover = crossover
        self._crossovers: dict[tuple, int] = {}  # (weight kind, out, in) -> measured few_rows_max
        self.policy = StepPolicy(self.policy.max_num_batched_tokens,
                                 AttentionPolicy(self.policy.attention.decode_token_budget,
                                                 self.policy.attention.prefill_block_rows,
                                                 fused_decode=ops is not None,
                                                 max_rows_as_decode=MAX_VERIFY_ROWS_AS_DECODE),
                                 verify_row_costs=CPU_VERIFY_ROW_COSTS,
                                 max_verify_rows_per_step=BLOCKS_MAX_ROWS["Q4_1"])
        if ops is not None:  # chosen once: the fused kernels replace the torch ops
            self.rms_norm = self._fused_rms_norm
            self.add_rms_norm = self._fused_add_rms_norm
            self.rope_store_kv = self._fused_rope_store_kv
            # one C call per layer on the calling thread for a span (torch's ops measured 2.6 ms a
            # 256-token span on one thread, 68 ms on two of a loaded 2-core machine)
            self.store_rerotated_kv = ops.rerotate_store_kv
            self.silu_and_mul = ops.silu_and_mul
            self.gelu_tanh_and_mul = ops.gelu_tanh_and_mul

    # ------------------------------------------------------------ load time

    def make_linear(self, name: str, layer: nn.Module, blocks: BlockWeight | None) -> nn.Module:
        weight, bias = layer.weight, layer.bias
        out_features, in_features = weight.shape
        packed = pack_weight(weight)
        few_rows, limit, kind = None, 0, ""
        if self.matvec is not None and blocks is not None:
            if (blocks.rows, blocks.cols) != (out_features, in_features):
                raise ValueError(f"{name}: block weight ({blocks.rows}, {blocks.cols}) does not fit a "
                                 f"({out_features}, {in_features}) projection")
            few_rows = functools.partial(self.matvec.matmul_blocks, weight=blocks)
            kind, limit = f"{blocks.format} blocks", BLOCKS_MAX_ROWS[blocks.format]
            if self.crossover == MEASURE:
                limit = max(CANDIDATE_ROWS)
        elif self.matvec is not None and self.matvec.fits(weight):
            few_rows = functools.partial(self.matvec, weight=weight)  # keeps the row-major copy
            kind, limit = "float32 row-major", MATVEC_F32_MAX_ROWS
        if few_rows is not None and self.crossover == MEASURE:
            key = (kind, out_features, in_features)
            if key not in self._crossovers:
                self._crossovers[key] = measure_crossover(
                    few_rows, functools.partial(packed_linear, packed_weight=packed, bias=None), in_features, limit)
            limit = self._crossovers[key]
        self._linears[name] = LinearPlan("oneDNN prepacked", f"C matvec over {kind}" if limit else "", limit)
        if blocks is not None and limit and limit < self.policy.max_verify_rows_per_step:
            # drafts never take a step past a projection's blocks kernel: the row-cost table holds there, and
            # a row's logits are those of a plain decode (the kernel's rows do not depend on m). (The float32
            # path's matvec takes one row: its verify chunks run on oneDNN, and keep the default limit.)
            self.policy = dataclasses.replace(self.policy, max_verify_rows_per_step=limit)
        return CpuLinear(packed, bias, out_features, few_rows if limit else None, limit)

    def plan(self) -> BackendPlan:
        notes = ()
        if self._crossovers:
            notes = ("measured few-rows limits " + ", ".join(
                f"{kind} ({rows}x{cols}): {limit}" for (kind, rows, cols), limit in sorted(self._crossovers.items())),)
        return BackendPlan(
            self.name, "cpu", "float32", dict(self._linears),
            row_ops="fused C kernels" if self.ops is not None else "torch ops",
            decode_attention=("fused C kernel over pages" if self.ops is not None
                              else "SDPA in length-sorted chunks"),
            prefill_attention="SDPA", fallbacks=self.fallbacks, notes=notes)

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
                               softcap=softcap)

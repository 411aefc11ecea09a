"""`torch`: the reference backend, plain torch ops. Also the CUDA and bfloat16 path."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kernels.activation import gelu_tanh_and_mul, silu_and_mul
from kernels.attention_inputs import AttentionInputs
from kernels.attention_plan import CPU_ATTENTION, ONE_CALL_ATTENTION
from kernels.paged_attention import paged_attention, store_kv
from kernels.rms_norm import rms_norm
from kernels.rotary import RotaryEmbedding
from model.backends.base import Backend, BackendPlan, LinearPlan, StepPolicy

# The step's token budget on CPU. Measured with bench.serve_bench (two runs, the four workloads at
# concurrency 4): against 2048, TTFT p50 fell in all 8 cases (up to 2x) and p99 in 7 of 8, because a
# 2048-token prefill chunk stalls every other request for seconds on CPU; TPOT rose on prefill-heavy
# workloads. On CUDA a chunk takes milliseconds: 2048 stays.
CPU_MAX_NUM_BATCHED_TOKENS = 512
ACCELERATOR_MAX_NUM_BATCHED_TOKENS = 2048


def step_policy_for(device: torch.device) -> StepPolicy:
    """The torch ops' policy: CPU cuts decode attention in length-sorted chunks and prefill
    rows in blocks; accelerators take a step's attention in as few calls as possible."""
    if device.type == "cpu":
        return StepPolicy(CPU_MAX_NUM_BATCHED_TOKENS, CPU_ATTENTION)
    return StepPolicy(ACCELERATOR_MAX_NUM_BATCHED_TOKENS, ONE_CALL_ATTENTION)


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, device: torch.device, dtype: torch.dtype, fallbacks: tuple[str, ...] = ()):
        self.device = torch.device(device)
        self.dtype = dtype
        self.policy = step_policy_for(self.device)
        self.fallbacks = fallbacks  # why a faster backend did not run, when `auto` fell back to this one
        self._linears: dict[str, LinearPlan] = {}

    def make_linear(self, name: str, layer: nn.Module, blocks: object | None) -> nn.Module:
        self._linears[name] = LinearPlan("torch F.linear")
        return layer

    def plan(self) -> BackendPlan:
        chunks = "SDPA in length-sorted chunks" if self.policy.attention.decode_token_budget < 2**62 else "SDPA"
        return BackendPlan(self.name, str(self.device), str(self.dtype).removeprefix("torch."), dict(self._linears),
                           row_ops="torch ops", decode_attention=chunks, prefill_attention="SDPA",
                           fallbacks=self.fallbacks, notes=self.weight_notes)

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return rms_norm(x, weight, eps)

    def add_rms_norm(self, residual: Tensor, x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        residual = residual + x
        return rms_norm(residual, weight, eps), residual

    def rope_store_kv(self, qkv: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                      slot_ids: Tensor, num_heads: int) -> Tensor:
        num_kv_heads = k_cache.shape[2]
        # q and k heads are adjacent in the fused projection: one rotation for both.
        qk = RotaryEmbedding.apply(qkv[:, : num_heads + num_kv_heads], cos, sin)  # (N, H + KVH, D)
        store_kv(k_cache, v_cache, qk[:, num_heads:], qkv[:, num_heads + num_kv_heads :], slot_ids)
        return qk[:, :num_heads]

    def store_rerotated_kv(self, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                           slot_ids: Tensor) -> None:
        store_kv(k_cache, v_cache, RotaryEmbedding.apply(k, cos, sin), v, slot_ids)

    def attention(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, attn: AttentionInputs,
                  scale: float, *, window: int | None = None, softcap: float | None = None) -> Tensor:
        return paged_attention(q, k_cache, v_cache, attn, scale, self.policy.attention, window=window,
                               softcap=softcap)

    def silu_and_mul(self, gate_up: Tensor) -> Tensor:
        return silu_and_mul(gate_up)

    def gelu_tanh_and_mul(self, gate_up: Tensor) -> Tensor:
        return gelu_tanh_and_mul(gate_up)

"""The execution-backend contract: what runs each op of the model, chosen once at load.

The model (model/decoder.py) is the math; every op with more than one implementation
is a call on its backend, which it never asks about. A backend also owns the step
policy its ops are fastest under (the default step token budget, how attention cuts
a step into calls), and says in one line what runs and why each fallback happened.
New fast paths (document stitching, speculative verification, CUDA graphs) are added
to a backend, not as branches in the model.

Calls happen under torch.inference_mode from the engine's single thread; a backend
holds no per-step state beyond what `step` sets for the one forward it wraps (which rows
are prompt rows).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from kernels.attention_inputs import AttentionInputs
from kernels.attention_plan import AttentionPolicy
from model.linear import Linear

# the decoder layers and final norm of one step: (hidden, ropes, kv_caches, attn) -> (N, d)
LayersFn = Callable[[Tensor, list, list, AttentionInputs], Tensor]


@dataclass(frozen=True)
class StepPolicy:
    """How the engine should cut work for this backend."""

    max_num_batched_tokens: int  # the default per-step token budget (decodes + prefill chunks)
    attention: AttentionPolicy
    # Entry r - 1: what a sequence's chunk of r rows after a cached prefix costs, relative to one row (a
    # speculative verify chunk: its last token + r - 1 drafts). The draft proposer picks the draft length
    # that emits the most tokens per unit of cost (engine/draft_proposer.py). Where rows are nearly free
    # (accelerators), all 1.0.
    verify_row_costs: tuple[float, ...] = (1.0,) * 9
    # The most rows (decodes + drafts) a step verifies drafts in: past it the table above does not hold
    # (on CPU the projections leave the few-rows kernels for the float32 GEMM, which reads 4x the bytes).
    max_verify_rows_per_step: int = 2048

    def __post_init__(self):
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_verify_rows_per_step < 1:
            raise ValueError(f"max_verify_rows_per_step must be >= 1, got {self.max_verify_rows_per_step}")
        if not self.verify_row_costs or self.verify_row_costs[0] != 1.0:
            raise ValueError(f"verify_row_costs must start at 1.0 (one row), got {self.verify_row_costs}")


@dataclass(frozen=True)
class LinearPlan:
    """What one kind of projection runs: `large` for most row counts, and below it the
    few-rows kernel for up to `few_rows_max` rows (0: none)."""

    large: str  # e.g. "oneDNN prepacked", "torch F.linear"
    few_rows: str = ""  # e.g. "C matvec over Q4_1 blocks"
    few_rows_max: int = 0

    def __str__(self) -> str:
        if not self.few_rows_max:
            return self.large
        return f"{self.few_rows} for <= {self.few_rows_max} rows, else {self.large}"


@dataclass(frozen=True)
class BackendPlan:
    """What runs, as data (describe() renders it; tests assert on it)."""

    name: str  # the registered name ("torch", "cpu")
    device: str
    dtype: str
    linears: dict[str, LinearPlan]  # module name ("layers.0.mlp.down_proj", "lm_head") -> its path
    row_ops: str  # RMSNorm, residual add + RMSNorm, RoPE + KV store, SwiGLU / GeGLU
    decode_attention: str
    prefill_attention: str
    fallbacks: tuple[str, ...] = ()  # each one line: what did not run, and why
    notes: tuple[str, ...] = field(default=())  # measured choices (crossovers), one line each

    def describe(self) -> str:
        kinds: dict[str, list[str]] = {}
        for name, plan in self.linears.items():
            kinds.setdefault(str(plan), []).append(_kind(name))
        linears = "; ".join(f"{'/'.join(sorted(set(names)))}: {path}" for path, names in kinds.items())
        text = (f"backend {self.name} ({self.device}, {self.dtype}): linear [{linears}]; row ops: {self.row_ops}; "
                f"decode attention: {self.decode_attention}; prefill attention: {self.prefill_attention}")
        if self.notes:
            text += "; " + "; ".join(self.notes)
        if self.fallbacks:
            text += "; fallbacks: " + "; ".join(self.fallbacks)
        return text


def _kind(module_name: str) -> str:
    """"layers.3.self_attn.qkv_proj" -> "qkv_proj"."""
    return module_name.rsplit(".", 1)[-1]


class Backend(ABC):
    """One object per loaded model. `prepare(model, blocks)` runs once after the
    weights are loaded; the ops below are then called by the model on every step."""

    name: str
    policy: StepPolicy
    reads_blocks: bool = False  # whether make_linear uses a weight's GGUF blocks (the loader reads them then)
    weight_notes: tuple[str, ...] = ()  # how the loader held the weights, when it had to say (describe() adds them)

    # ------------------------------------------------------------ load time

    @abstractmethod
    def make_linear(self, name: str, layer: nn.Module, blocks: list | None) -> nn.Module:
        """The layer object that runs `layer` (a model.linear.Linear): `layer` itself, or a
        faster one of the backend's own with the same contract, x (M, in) -> (M, out).
        `blocks`: the weight as blocks (kernels.block_formats.BlockWeight parts, row-wise),
        its only form, when the loader kept it so (only for a backend that `reads_blocks`;
        `layer.weight` is then unfilled), else None and `layer` holds the weights."""

    def make_embedding(self, layer: nn.Module, blocks: list) -> nn.Module:
        """The embedding table as blocks (one BlockWeight): a module ids (...) -> (..., d)."""
        raise NotImplementedError(f"backend {self.name} reads no blocks")

    def prepare(self, model: nn.Module, blocks: dict[str, list]) -> None:
        """Swap every Linear of `model` for make_linear's layer (in place), and the embedding
        table for make_embedding's where it is blocks. `blocks` maps module names to their
        block weights."""
        if "embed_tokens" in blocks:
            model.embed_tokens = self.make_embedding(model.embed_tokens, blocks["embed_tokens"])
        for name, module in list(model.named_modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, Linear):
                    full_name = f"{name}.{child_name}" if name else child_name
                    setattr(module, child_name, self.make_linear(full_name, child, blocks.get(full_name)))

    def step(self, attn: AttentionInputs) -> contextlib.AbstractContextManager:
        """Around one forward over the step `attn` describes, for a backend whose products differ by kind of
        row (prompt or generated: AttentionInputs.num_generated; cpu under bf16 products)."""
        return contextlib.nullcontext()

    def run_layers(self, layers: LayersFn, hidden: Tensor, ropes: list[tuple[Tensor, Tensor]], kv_caches: list,
                   attn: AttentionInputs) -> Tensor:
        """`layers(hidden, ropes, kv_caches, attn)`: the decoder layers and the final norm over one step,
        hidden (N, d) -> (N, d). A backend may run a step it has seen the like of some faster way with the
        same result (cpu: a recorded decode step replayed in C, model/backends/decode_programs.py)."""
        return layers(hidden, ropes, kv_caches, attn)

    @abstractmethod
    def plan(self) -> BackendPlan:
        """What runs (complete after prepare)."""

    def describe(self) -> str:
        """One line: what runs, and why each fallback happened."""
        return self.plan().describe()

    # ------------------------------------------------------------ the ops

    @abstractmethod
    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """x (N, d) -> x / sqrt(mean(x^2) + eps) * weight, a new tensor."""

    @abstractmethod
    def add_rms_norm(self, residual: Tensor, x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        """-> (rms_norm(residual + x), residual + x). The stream may be `residual`
        updated in place; callers use the returned one."""

    def qk_norm(self, qkv: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float, num_heads: int) -> Tensor:
        """qkv (N, H + 2*KVH, D) -> the same with each q head rms-normed over its D values with q_weight and
        each k head with k_weight (Qwen3, Gemma 3); the v heads as they are. A contiguous tensor, maybe qkv."""
        tokens, heads, dim = qkv.shape
        num_kv_heads = (heads - num_heads) // 2
        q = self.rms_norm(qkv[:, :num_heads].reshape(-1, dim), q_weight, eps).view(tokens, num_heads, dim)
        k = self.rms_norm(qkv[:, num_heads:num_heads + num_kv_heads].reshape(-1, dim), k_weight, eps)
        return torch.cat((q, k.view(tokens, num_kv_heads, dim), qkv[:, num_heads + num_kv_heads:]), dim=1)

    @abstractmethod
    def rope_store_kv(self, qkv: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                      slot_ids: Tensor, num_heads: int) -> Tensor:
        """qkv (N, H + 2*KVH, D): q heads, k heads, v heads of the step's tokens. Rotates q
        and k (cos, sin (N, 1, R): the first R <= D dimensions of each head rotate), writes k and
        v into slots slot_ids (N,) of the caches (num_pages, page_size, KVH, D) -> the rotated
        q (N, H, D), possibly a view of qkv (which may be modified)."""

    @abstractmethod
    def store_rerotated_kv(self, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                           slot_ids: Tensor) -> None:
        """Stored document KV placed at a new position: k, v (T, KVH, D), k rotated by one position
        delta with cos, sin (1, 1, R) (kernels.rotary.rerotation_cos_sin), v as is, written into
        slots slot_ids (T,) of the caches. k and v are left unchanged."""

    @abstractmethod
    def attention(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, attn: AttentionInputs,
                  scale: float, *, window: int | None = None, softcap: float | None = None) -> Tensor:
        """Paged attention of the step's queries q (N, H, D) over the caches (KVPages of any format,
        read as stored: no dequantized copy of the pool), prefills and decodes alike (kernels.paged_attention_reference is the contract) -> (N, H, D).
        `window`: the layer's sliding window; `softcap`: its score cap (None: none)."""

    @abstractmethod
    def silu_and_mul(self, gate_up: Tensor) -> Tensor:
        """gate_up (N, 2*I) -> silu(gate) * up (N, I), gate the first half."""

    @abstractmethod
    def gelu_tanh_and_mul(self, gate_up: Tensor) -> Tensor:
        """gate_up (N, 2*I) -> gelu_tanh(gate) * up (N, I), gate the first half (GeGLU)."""

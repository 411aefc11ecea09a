"""One Llama-family decoder over a paged KV cache: the math only.

Covers Llama 2/3 (incl. llama3 RoPE scaling), SmolLM/SmolLM2, Mistral and Qwen2
(q/k/v bias): GQA, tied or untied embeddings. Tokens of every sequence in a step
are flattened into one (N,) batch; attention finds each sequence's rows through
`AttentionInputs`. Projections are fused (q|k|v and gate|up) so a layer runs
three GEMMs instead of seven; the loader fills them (model/checkpoint_names.py).
Every op that has more than one implementation is a call on the execution
backend (model/backends/base.py), chosen once at load; the code here never asks
which one it is.
"""

import torch
from torch import Tensor, nn

from kernels.attention_inputs import AttentionInputs
from kernels.rotary import RotaryEmbedding
from model.backends.base import Backend
from model.config import ModelConfig
from model.linear import Linear


class RMSNorm(nn.Module):
    """rms_norm(x), or with a `residual`: residual + x, then rms_norm of that sum
    (the add that joins a sublayer's output to the stream, fused with the next norm)."""

    def __init__(self, size: int, eps: float, backend: Backend):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.backend = backend

    def forward(self, x: Tensor, residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """-> (normed, the residual stream after the add); `x` itself is the stream when no residual."""
        if residual is None:
            return self.backend.rms_norm(x, self.weight, self.eps), x
        return self.backend.add_rms_norm(residual, x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, backend: Backend):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.scale = config.head_dim**-0.5
        self.qkv_proj = Linear(config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.has_qkv_bias)
        self.o_proj = Linear(config.q_size, config.hidden_size, bias=False)
        self.backend = backend

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], kv_cache: tuple[Tensor, Tensor], attn: AttentionInputs
    ) -> Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x).view(num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        q = self.backend.rope_store_kv(qkv, *rope, k_cache, v_cache, attn.slot_ids, self.num_heads)  # (N, H, D)
        out = self.backend.attention(q, k_cache, v_cache, attn, self.scale)  # (N, H, D)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, backend: Backend):
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.backend = backend

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.backend.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: Backend):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
        self.self_attn = Attention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
        self.mlp = MLP(config, backend)

    def forward(self, hidden, residual, rope, kv_cache, attn):
        """hidden: the previous sublayer's output, not yet added to the residual stream
        (None before the first layer, where `hidden` is the stream) -> the same pair."""
        normed, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(normed, rope, kv_cache, attn)
        normed, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(normed), residual


class LlamaForCausalLM(nn.Module):
    """Parameters are created empty on `device`/`dtype`; model/weights.py fills them.
    `lm_head` is always a Linear; with tied embeddings its weight is the embedding table."""

    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype, backend: Backend):
        super().__init__()
        self.config = config
        self.backend = backend
        # RoPE tables stay float32 whatever the model dtype, as in HF.
        self.rotary = RotaryEmbedding(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            device=device,
        )
        # Built on the meta device then materialised uninitialised: random
        # init of 100M+ parameters would only be overwritten by the loader.
        with torch.device("meta"):
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
            self.layers = nn.ModuleList(DecoderLayer(config, backend) for _ in range(config.num_layers))
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
            self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.to(dtype).to_empty(device=device)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.requires_grad_(False)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: Tensor,  # (N,) int64
        positions: Tensor,  # (N,) int64
        kv_caches: list[tuple[Tensor, Tensor]],  # per layer (num_pages, page_size, KVH, D) pair
        attn: AttentionInputs,
        num_layers: int | None = None,
    ) -> Tensor:
        """-> (N, d): the final norm of the last layer's stream. With `num_layers`, only the first
        num_layers layers run (each writing its K/V as usual) and the stream after them is returned,
        not normed: a probe that wants those layers' K/V only (engine/selective_recompute.py)."""
        hidden = self.embed_tokens(input_ids)  # (N, d), a fresh tensor: the residual stream, updated in place
        rope = self.rotary.cos_sin(positions, hidden.dtype)  # (N, 1, D) each, shared by all layers
        residual = None
        layers = self.layers if num_layers is None else self.layers[:num_layers]
        for layer, kv_cache in zip(layers, kv_caches):
            hidden, residual = layer(hidden, residual, rope, kv_cache, attn)
        if num_layers is not None:
            return hidden if residual is None else residual + hidden
        return self.norm(hidden, residual)[0]

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(M, d) -> (M, V) float32. Called on the rows that need logits only
        (a prefill chunk's last token), which keeps the 49k-wide head off the
        prefill's critical path."""
        return self.lm_head(hidden).float()

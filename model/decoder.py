"""One decoder-only transformer over a paged KV cache, for every supported family: the math only.

Llama 2/3.x (llama3 / freq_factors RoPE), SmolLM, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k norm),
Gemma 2/3 (GeGLU, (1 + w) norms folded at load, sandwich norms around attention and MLP,
embedding scaling, soft caps, sliding-window layers with their own RoPE) and Phi-3/4 (longrope,
partial rotary dimensions). What differs is a fact of the ModelConfig (model/config.py) that the
code below reads, never a subclass per family. Tokens of every sequence in a step are flattened
into one (N,) batch; attention finds each sequence's rows through `AttentionInputs`. Projections
are fused (q|k|v and gate|up) so a layer runs three GEMMs instead of seven; the loader fills them
(store/checkpoint_names.py). Every op that has more than one implementation is a call on the
execution backend (model/backends/base.py), chosen once at load; the code here never asks which.
"""

import torch
from torch import Tensor, nn

from kernels.attention_inputs import AttentionInputs
from kernels.kv_format import LayerKV
from kernels.rotary import RotaryEmbedding
from model.backends.base import Backend
from model.config import ModelConfig
from model.linear import Linear

GLOBAL_ROPE, SLIDING_ROPE = 0, 1  # indices into the per-step (cos, sin) pairs


class RMSNorm(nn.Module):
    """rms_norm(x), or with a `residual`: residual + x, then rms_norm of that sum
    (the add that joins a sublayer's output to the stream, fused with the next norm).
    Gemma's x * (1 + w) is this with w + 1 as the weight (the loader adds the 1)."""

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
    def __init__(self, config: ModelConfig, layer: int, backend: Backend):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.scale = config.attention_scale
        self.window = config.window_of(layer)  # None: a global layer
        self.softcap = config.attn_logit_softcap
        self.rope_index = SLIDING_ROPE if config.uses_sliding_rope(layer) else GLOBAL_ROPE
        self.qkv_proj = Linear(config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.has_qkv_bias)
        self.o_proj = Linear(config.q_size, config.hidden_size, bias=False)
        self.q_norm = self.k_norm = None
        if config.has_qk_norm:  # over each head's D values
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, backend)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, backend)
        self.backend = backend

    def forward(
        self, x: Tensor, ropes: list[tuple[Tensor, Tensor]], kv_cache: LayerKV, attn: AttentionInputs
    ) -> Tensor:
        num_tokens = x.shape[0]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x).view(num_tokens, heads + 2 * kv_heads, dim)
        if self.q_norm is not None:  # (N, H + 2*KVH, D) contiguous
            qkv = self.backend.qk_norm(qkv, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, heads)
        k_cache, v_cache = kv_cache
        q = self.backend.rope_store_kv(qkv, *ropes[self.rope_index], k_cache, v_cache, attn.slot_ids, heads)
        out = self.backend.attention(q, k_cache, v_cache, attn, self.scale, window=self.window,
                                     softcap=self.softcap)  # (N, H, D)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, backend: Backend):
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.is_geglu = config.hidden_act == "gelu_tanh"
        self.backend = backend

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up_proj(x)
        if self.is_geglu:
            return self.down_proj(self.backend.gelu_tanh_and_mul(gate_up))
        return self.down_proj(self.backend.silu_and_mul(gate_up))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, backend: Backend):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, backend)
        self.self_attn = Attention(config, layer, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, backend)  # the MLP's input norm
        self.mlp = MLP(config, backend)
        self.attn_output_norm = self.mlp_output_norm = None
        if config.has_sandwich_norms:
            self.attn_output_norm = RMSNorm(config.hidden_size, eps, backend)
            self.mlp_output_norm = RMSNorm(config.hidden_size, eps, backend)

    def forward(self, hidden, residual, ropes, kv_cache, attn):
        """hidden: the previous sublayer's output, not yet added to the residual stream
        (None before the first layer, where `hidden` is the stream) -> the same pair."""
        normed, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(normed, ropes, kv_cache, attn)
        if self.attn_output_norm is not None:
            hidden = self.attn_output_norm(hidden)[0]
        normed, residual = self.post_attention_layernorm(hidden, residual)
        hidden = self.mlp(normed)
        if self.mlp_output_norm is not None:
            hidden = self.mlp_output_norm(hidden)[0]
        return hidden, residual


def _materialize_empty(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Every meta parameter becomes an uninitialised tensor of `dtype` on `device`. By hand, not
    `to(dtype).to_empty()`, and with no init on the meta device (the embedding is given its table):
    those run torch's Python meta kernels, whose import (sympy, mpmath) held 70 MiB resident."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.is_meta:
                setattr(module, name, nn.Parameter(torch.empty(param.shape, dtype=dtype, device=device),
                                                   requires_grad=param.requires_grad))
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_meta:
                module._buffers[name] = torch.empty(buffer.shape, dtype=buffer.dtype, device=device)


class DecoderForCausalLM(nn.Module):
    """Parameters are created empty on `device`/`dtype`; model/weights.py fills them.
    `lm_head` is always a Linear; with tied embeddings its weight is the embedding table.
    `long_context`: longrope's long factors (the served context exceeds the original one)."""

    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype, backend: Backend,
                 long_context: bool = False):
        super().__init__()
        self.config = config
        self.backend = backend
        # RoPE tables stay float32 whatever the model dtype, as in HF.
        self.rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta,
                                      config.rope_scaling, device=device, rotary_dim=config.rotary_dim,
                                      long_context=long_context)
        self.sliding_rotary = None
        if config.sliding_rope_theta is not None:
            self.sliding_rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                                  config.sliding_rope_theta, config.sliding_rope_scaling,
                                                  device=device, rotary_dim=config.rotary_dim)
        # Built on the meta device then materialised uninitialised: random
        # init of 100M+ parameters would only be overwritten by the loader.
        with torch.device("meta"):
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                             _weight=torch.empty(config.vocab_size, config.hidden_size))
            self.layers = nn.ModuleList(DecoderLayer(config, i, backend) for i in range(config.num_layers))
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, backend)
            self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        _materialize_empty(self, device, dtype)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.requires_grad_(False)

    @property
    def layer_inv_freqs(self) -> list[Tensor]:
        """Per layer, its RoPE's inverse frequencies (R/2,) float32: what re-rotating its stored K
        by a position delta needs (engine/document_kv_copy.py)."""
        return [self._rotary_of(layer.self_attn).inv_freq for layer in self.layers]

    def _rotary_of(self, attention: Attention) -> RotaryEmbedding:
        return self.sliding_rotary if attention.rope_index == SLIDING_ROPE else self.rotary

    @torch.inference_mode()
    def forward(
        self,
        input_ids: Tensor,  # (N,) int64
        positions: Tensor,  # (N,) int64
        kv_caches: list[LayerKV],  # per layer K and V pages (num_pages, page_size, KVH, D), any KV format
        attn: AttentionInputs,
        num_layers: int | None = None,
    ) -> Tensor:
        """-> (N, d): the final norm of the last layer's stream. With `num_layers`, only the first
        num_layers layers run (each writing its K/V as usual) and the stream after them is returned,
        not normed: a probe that wants those layers' K/V only (engine/selective_recompute.py).
        The backend sees the step's rows for the whole forward (Backend.step)."""
        with self.backend.step(attn):
            return self._forward(input_ids, positions, kv_caches, attn, num_layers)

    def _forward(self, input_ids: Tensor, positions: Tensor, kv_caches: list[LayerKV], attn: AttentionInputs,
                 num_layers: int | None) -> Tensor:
        hidden = self.embed_tokens(input_ids)  # (N, d), a fresh tensor: the residual stream, updated in place
        if self.config.embedding_multiplier != 1.0:
            hidden = hidden * self.config.embedding_multiplier
        # (N, 1, R) cos and sin per RoPE, shared by all layers
        ropes = [self.rotary.cos_sin(positions, hidden.dtype)]
        if self.sliding_rotary is not None:
            ropes.append(self.sliding_rotary.cos_sin(positions, hidden.dtype))
        if num_layers is not None:
            hidden, residual = self._run_layers(self.layers[:num_layers], hidden, ropes, kv_caches, attn)
            return hidden if residual is None else residual + hidden
        return self.backend.run_layers(self._layers_and_norm, hidden, ropes, kv_caches, attn)

    def _layers_and_norm(self, hidden: Tensor, ropes: list[tuple[Tensor, Tensor]], kv_caches: list[LayerKV],
                         attn: AttentionInputs) -> Tensor:
        return self.norm(*self._run_layers(self.layers, hidden, ropes, kv_caches, attn))[0]

    @staticmethod
    def _run_layers(layers, hidden: Tensor, ropes: list[tuple[Tensor, Tensor]], kv_caches: list[LayerKV],
                    attn: AttentionInputs) -> tuple[Tensor, Tensor | None]:
        residual = None
        for layer, kv_cache in zip(layers, kv_caches):
            hidden, residual = layer(hidden, residual, ropes, kv_cache, attn)
        return hidden, residual

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(M, d) -> (M, V) float32. Called on the rows that need logits only
        (a prefill chunk's last token), which keeps the 49k-wide head off the
        prefill's critical path."""
        logits = self.lm_head(hidden).float()
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

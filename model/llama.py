"""One Llama-family decoder over a paged KV cache.

Covers Llama 2/3 (incl. llama3 RoPE scaling), SmolLM/SmolLM2, Mistral and Qwen2
(q/k/v bias): GQA, tied or untied embeddings. Tokens of every sequence in a step
are flattened into one (N,) batch; attention finds each sequence's rows through
`AttentionInputs`. Projections are fused (q|k|v and gate|up) so a layer runs
three GEMMs instead of seven; the loader concatenates the HF tensors.
"""

import functools
from collections.abc import Callable

import torch
from torch import Tensor, nn

from model.config import ModelConfig
from kernels.activation import silu_and_mul
from kernels.cpu_decode_ops import CpuDecodeOps
from kernels.cpu_matvec import BLOCKS_MAX_ROWS, BlockWeight, CpuMatvec
from kernels.packed_linear import pack_weight, packed_linear
from kernels.paged_attention import AttentionInputs, paged_attention, store_kv
from kernels.rms_norm import rms_norm
from kernels.rotary import RotaryEmbedding


class Linear(nn.Module):
    """y = x @ weight^T (+ bias), weight (out, in) as HF stores it.

    On CPU in float32 `pack()` moves the weight into oneDNN's prepacked layout
    (kernels/packed_linear.py) for large inputs, and gives few-row inputs
    (decode) a faster kernel (kernels/cpu_matvec.py): the GGUF blocks of the
    weight when the model has them, for up to BLOCKS_MAX_ROWS[format] rows; otherwise
    a row-major float32 copy for single rows. Elsewhere (CUDA, bfloat16) the
    plain F.linear runs: measured on these CPUs, bf16 x @ W^T runs ~8x faster
    in this layout than in the transposed one.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed_weight: Tensor | None = None
        self.block_weight: BlockWeight | None = None
        # x (m, in) -> x @ weight^T for m <= few_rows_max (set by pack(); 0: never)
        self.few_rows: Callable[[Tensor], Tensor] | None = None
        self.few_rows_max = 0

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[0] <= self.few_rows_max:
            y = self.few_rows(x)
            return y + self.bias if self.bias is not None else y
        if self.packed_weight is not None:
            return packed_linear(x, self.packed_weight, self.bias)
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def pack(self, kernels: "CpuMatvec | None" = None, block_weight: BlockWeight | None = None) -> None:
        """Switch to the prepacked path, plus `kernels` for few-row inputs: over
        `block_weight` when given (the float32 weight is dropped), else over a
        kept row-major float32 weight (twice the memory)."""
        out_features, in_features = self.weight.shape
        if block_weight is not None and (block_weight.rows, block_weight.cols) != (out_features, in_features):
            raise ValueError(f"block weight ({block_weight.rows}, {block_weight.cols}) does not fit a "
                             f"({out_features}, {in_features}) projection")
        self.packed_weight = pack_weight(self.weight)
        if kernels is not None and block_weight is not None:
            self.block_weight = block_weight
            self.few_rows = functools.partial(kernels.matmul_blocks, weight=block_weight)
            self.few_rows_max = BLOCKS_MAX_ROWS[block_weight.format]
        elif kernels is not None and kernels.fits(self.weight):
            self.few_rows = functools.partial(kernels, weight=self.weight)
            self.few_rows_max = 1
            return
        self.weight = nn.Parameter(torch.empty(0), requires_grad=False)


class RMSNorm(nn.Module):
    """rms_norm(x), or with a `residual`: residual += x, then rms_norm(residual)
    (the add that joins a sublayer's output to the stream, fused with the next norm)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.ops: CpuDecodeOps | None = None  # fused C kernels, set by pack_weights()

    def forward(self, x: Tensor, residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """-> (normed, the residual stream after the add); `x` itself is the stream when no residual."""
        if self.ops is not None:
            if residual is None:
                return self.ops.rms_norm(x, self.weight, self.eps), x
            return self.ops.add_rms_norm(residual, x, self.weight, self.eps), residual
        residual = x if residual is None else residual + x
        return rms_norm(residual, self.weight, self.eps), residual


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.kv_size = config.kv_size
        self.scale = config.head_dim**-0.5
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.has_qkv_bias
        )
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=False)
        self.ops: CpuDecodeOps | None = None  # fused C kernels, set by pack_weights()

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor], kv_cache: tuple[Tensor, Tensor], attn: AttentionInputs
    ) -> Tensor:
        num_tokens = x.shape[0]
        num_heads, num_kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(num_tokens, num_heads + 2 * num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        if self.ops is not None:
            # rotates q and k in place in qkv, then writes k and v into their slots
            self.ops.rope_store_kv(qkv, *rope, k_cache, v_cache, attn.slot_ids)
            q = qkv[:, :num_heads]  # (N, H, D), a strided view
        else:
            # q and k heads are adjacent in the fused projection: one rotation for both.
            qk = RotaryEmbedding.apply(qkv[:, : num_heads + num_kv_heads], *rope)  # (N, H + KVH, D)
            q, k = qk[:, :num_heads], qk[:, num_heads:]  # (N, H, D), (N, KVH, D)
            v = qkv[:, num_heads + num_kv_heads :]  # (N, KVH, D)
            store_kv(k_cache, v_cache, k, v, attn.slot_ids)
        out = paged_attention(q, k_cache, v_cache, attn, self.scale, self.ops)  # (N, H, D)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.ops: CpuDecodeOps | None = None  # fused C kernels, set by pack_weights()

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up_proj(x)
        return self.down_proj(self.ops.silu_and_mul(gate_up) if self.ops is not None else silu_and_mul(gate_up))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, hidden, residual, rope, kv_cache, attn):
        """hidden: the previous sublayer's output, not yet added to the residual stream
        (None before the first layer, where `hidden` is the stream) -> the same pair."""
        normed, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(normed, rope, kv_cache, attn)
        normed, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(normed), residual


class LlamaForCausalLM(nn.Module):
    """Parameters are created empty on `device`/`dtype`; `model.weights` fills them."""

    def __init__(self, config: ModelConfig, device: torch.device, dtype: torch.dtype):
        super().__init__()
        self.config = config
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
            self.layers = nn.ModuleList(
                DecoderLayer(config) for _ in range(config.num_layers)
            )
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            if not config.tie_word_embeddings:
                self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.to(dtype).to_empty(device=device)
        self.packed_head: Linear | None = None  # set by pack_weights()
        self.requires_grad_(False)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: Tensor,  # (N,) int64
        positions: Tensor,  # (N,) int64
        kv_caches: list[tuple[Tensor, Tensor]],  # per layer (num_pages, page_size, KVH, D) pair
        attn: AttentionInputs,
    ) -> Tensor:
        hidden = self.embed_tokens(input_ids)  # (N, d), a fresh tensor: the residual stream, updated in place
        rope = self.rotary.cos_sin(positions, hidden.dtype)  # (N, 1, D) each, shared by all layers
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(hidden, residual, rope, kv_cache, attn)
        return self.norm(hidden, residual)[0]

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(M, d) -> (M, V) float32. Called on the rows that need logits only
        (a prefill chunk's last token), which keeps the 49k-wide head off the
        prefill's critical path."""
        if self.packed_head is not None:
            return self.packed_head(hidden)
        head = self.embed_tokens if self.config.tie_word_embeddings else self.lm_head
        return torch.nn.functional.linear(hidden, head.weight).float()

    def pack_weights(
        self,
        kernels: "CpuMatvec | None" = None,
        blocks: dict[str, BlockWeight] | None = None,
        ops: CpuDecodeOps | None = None,
    ) -> None:
        """Move every projection and the LM head to the packed path (Linear.pack).
        `blocks` maps module names ("layers.0.mlp.down_proj", "lm_head") to their
        GGUF blocks, which few-row inputs then read. The head becomes a Linear of
        its own; a tied one keeps the embedding table for lookups. `ops` (when
        the model's sizes fit them) replace the norms, RoPE + KV store, decode
        attention and SwiGLU."""
        blocks = blocks or {}
        config = self.config
        if ops is not None and ops.fits(config.hidden_size, config.intermediate_size, config.num_heads,
                                        config.num_kv_heads, config.head_dim):
            for module in self.modules():
                if isinstance(module, (RMSNorm, Attention, MLP)):
                    module.ops = ops
        for name, module in self.named_modules():
            if isinstance(module, Linear):
                module.pack(kernels, blocks.get(name))
        head_weight = (self.embed_tokens if self.config.tie_word_embeddings else self.lm_head).weight
        with torch.device("meta"):
            head = Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        head.weight = head_weight
        head.pack(kernels, blocks.get("lm_head"))
        self.packed_head = head
        if not self.config.tie_word_embeddings:
            self.lm_head = None  # the packed head holds what it needs

"""Attention over a paged KV cache: writing new K/V, and the dispatching entry point.

KV layout: per layer K and V pages (kernels/kv_format.py: values (num_pages, page_size, KVH, D) in
their format, int8 with per-(token, head) scales); viewed flat as (num_pages * page_size, KVH, D),
token slot s = page_id * page_size + offset in page. A bare tensor is pages of its own dtype. The
torch path gathers a sequence's slots and dequantizes only those.
The torch path uses only torch ops (SDPA), so it runs wherever torch does; how it batches
work is the caller's `AttentionPolicy` (see attention_plan), chosen by the execution backend,
which may also hand decodes and prefills to C kernels that read the pages themselves
(kernels/cpu_decode_ops.py, kernels/cpu_prefill_attention.py).
A layer may have a sliding window (a mask; see attention_plan) and a soft cap on its scores
(Gemma 2: cap * tanh(s / cap) before the mask), which SDPA cannot apply: soft-capped layers
compute the same cuts with explicit matmuls and softmax.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.attention_inputs import AttentionInputs
from kernels.attention_plan import AttentionPolicy, DecodeChunk, PrefillSeq
from kernels.cpu_decode_ops import CpuDecodeOps
from kernels.cpu_prefill_attention import CpuPrefillAttention
from kernels.kv_format import KVPages, as_pages
from kernels.paged_attention_reference import paged_attention_reference

__all__ = ["AttentionInputs", "store_kv", "paged_attention", "paged_attention_reference"]

# SDPA learned enable_gqa (query heads sharing a KV head, without copying K/V) in torch 2.5.
_SDPA_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def store_kv(k_cache: Tensor | KVPages, v_cache: Tensor | KVPages, k: Tensor, v: Tensor, slot_ids: Tensor) -> None:
    """Writes k, v (N, KVH, D) into slots slot_ids (N,) of the caches, in place, in their formats
    (KVPages.store: a non-contiguous cache fails loudly rather than have the write land in a copy)."""
    as_pages(k_cache).store(slot_ids, k)
    as_pages(v_cache).store(slot_ids, v)


def paged_attention(
    q: Tensor,
    k_cache: Tensor | KVPages,
    v_cache: Tensor | KVPages,
    inputs: AttentionInputs,
    scale: float,
    policy: AttentionPolicy,
    decode_ops: CpuDecodeOps | None = None,
    *,
    window: int | None = None,
    softcap: float | None = None,
    prefill_ops: CpuPrefillAttention | None = None,
) -> Tensor:
    """q (N, H, D) -> (N, H, D) in q.dtype; same contract as paged_attention_reference.

    The step's new K/V must already be in the cache (store_kv). Decode sequences go in
    length-sorted chunks, or, when the policy says fused_decode, all in one call of
    `decode_ops`' kernel, which reads the pages itself; prefills one by one, or, when the
    policy says fused_prefill, all in one call of `prefill_ops`' kernel, which reads the pages
    itself; results land in their rows of the output. `window`, `softcap`: the layer's sliding
    window and score cap (None: none).
    """
    if policy.fused_decode and decode_ops is None:
        raise ValueError("a fused-decode attention policy needs the decode kernel")
    if policy.fused_prefill and prefill_ops is None:
        raise ValueError("a fused-prefill attention policy needs the prefill kernel")
    k_cache, v_cache = as_pages(k_cache), as_pages(v_cache)
    _, page_size, num_kv_heads, head_dim = k_cache.shape
    if q.shape[0] != inputs.num_tokens or q.shape[1] % num_kv_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit {inputs.num_tokens} tokens, {num_kv_heads} KV heads")
    plan = inputs.plan(page_size, policy, window)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if plan.decode_batch is not None:
        batch = plan.decode_batch
        decode_ops.paged_decode_attention(q, k_cache, v_cache, batch.page_table, batch.context_lens, batch.rows,
                                          scale, out, window, softcap)
    if plan.prefill_batch is not None:
        batch = plan.prefill_batch
        prefill_ops.paged_prefill_attention(q, k_cache, v_cache, batch.page_table, batch.q_starts, batch.query_lens,
                                            batch.context_lens, scale, out, window, softcap)
    for chunk in plan.decode_chunks:
        _attend_decode(out, q, k_cache, v_cache, chunk, scale, softcap)
    for seq in plan.prefills:
        _attend_prefill(out, q, k_cache, v_cache, seq, scale, plan.prefill_block_rows, softcap, window)
    return out


def _attend_decode(
    out: Tensor, q: Tensor, k_cache: KVPages, v_cache: KVPages, chunk: DecodeChunk, scale: float,
    softcap: float | None
) -> None:
    """One new token per sequence: the group = H // KVH query heads sharing a KV head become
    the query rows of that KV head, so GQA needs neither a repeat nor a causal mask."""
    b, length = chunk.num_seqs, chunk.max_len
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    k = k_cache.gather(chunk.slot_ids, q.dtype).view(b, length, num_kv_heads, head_dim)
    v = v_cache.gather(chunk.slot_ids, q.dtype).view(b, length, num_kv_heads, head_dim)
    q_grouped = q.index_select(0, chunk.rows).view(b, num_kv_heads, -1, head_dim)  # (b, KVH, G, D)
    if softcap is None:
        o = F.scaled_dot_product_attention(
            q_grouped, k.transpose(1, 2), v.transpose(1, 2), attn_mask=chunk.mask, scale=scale
        )  # (b, KVH, G, D)
    else:
        o = _softcapped_attention(q_grouped, k.transpose(1, 2), v.transpose(1, 2), chunk.mask, scale, softcap)
    out.index_copy_(0, chunk.rows, o.reshape(b, num_heads, head_dim))


def _attend_prefill(
    out: Tensor,
    q: Tensor,
    k_cache: KVPages,
    v_cache: KVPages,
    seq: PrefillSeq,
    scale: float,
    block_rows: int,
    softcap: float | None,
    window: int | None,
) -> None:
    """Rows [start, end) of one sequence against its whole context (with a window, a block of rows
    reads only the keys from its first row's window on)."""
    q_seq = q[seq.start : seq.end].transpose(0, 1)[None]  # (1, H, T, D)
    k = k_cache.gather(seq.slot_ids, q.dtype).transpose(0, 1)[None]  # (1, KVH, C, D)
    v = v_cache.gather(seq.slot_ids, q.dtype).transpose(0, 1)[None]
    if seq.mask is None:
        o = _sdpa_gqa(q_seq, k, v, None, scale, softcap)  # (1, H, T, D)
        out[seq.start : seq.end] = o[0].transpose(0, 1)
        return
    query_len, context_len = seq.mask.shape
    prefix_len = context_len - query_len
    for row in range(0, query_len, block_rows):
        row_end = min(row + block_rows, query_len)
        visible = prefix_len + row_end  # no row of this block sees a key beyond this
        first = 0 if window is None else max(0, prefix_len + row - window + 1)  # ... nor one before this
        o = _sdpa_gqa(
            q_seq[:, :, row:row_end],
            k[:, :, first:visible],
            v[:, :, first:visible],
            seq.mask[row:row_end, first:visible],
            scale,
            softcap,
        )  # (1, H, rows, D)
        out[seq.start + row : seq.start + row_end] = o[0].transpose(0, 1)


def _sdpa_gqa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
              softcap: float | None = None) -> Tensor:
    """q (1, H, T, D), k/v (1, KVH, C, D); causal from the top-left when mask is None."""
    if softcap is not None:
        group = q.shape[1] // k.shape[1]
        q_grouped = q.reshape(1, k.shape[1], group * q.shape[2], q.shape[3])  # (1, KVH, G*T, D): head-major
        if mask is None:
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        mask = mask.repeat(group, 1)  # (G*T, C): each query head's rows see what the token's row sees
        o = _softcapped_attention(q_grouped, k, v, mask, scale, softcap)  # (1, KVH, G*T, D)
        return o.reshape(q.shape)
    is_causal = mask is None
    if _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True
        )
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)


def _softcapped_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                          softcap: float) -> Tensor:
    """q (b, KVH, M, D), k/v (b, KVH, C, D), mask broadcast to (b, KVH, M, C) bool (True: visible)
    or None -> (b, KVH, M, D): softmax(softcap * tanh(q k^T * scale / softcap), masked) v, the
    softmax in float32 (HF Gemma 2's eager attention)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (b, KVH, M, C)
    scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)

"""Paged attention, the plain way: the definition every fast path is tested against."""

import torch
from torch import Tensor

from kernels.kv_format import KVPages, as_pages


def paged_attention_reference(
    q: Tensor, k_cache: Tensor | KVPages, v_cache: Tensor | KVPages, inputs, scale: float, *, window: int | None = None,
    softcap: float | None = None,
) -> Tensor:
    """q (N, H, D), caches (num_pages, page_size, KVH, D) in any KV format -> (N, H, D) in q.dtype.

    Per sequence: gather its first context_len KV slots in page order, repeat each KV head
    for its H // KVH query heads, scores times scale (then softcap * tanh(s / softcap) with a
    soft cap), mask causally (query i sits at position C - T + i; with a sliding window W it
    also sees no key W or more positions behind it), and softmax in float32.
    """
    k_cache, v_cache = as_pages(k_cache), as_pages(v_cache)
    _, page_size, num_kv_heads, head_dim = k_cache.shape
    group = q.shape[1] // num_kv_heads
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for b, context_len in enumerate(inputs.context_lens):
        start, end = inputs.query_starts[b], inputs.query_starts[b + 1]
        positions = torch.arange(context_len, device=q.device)  # (C,)
        pages = inputs.page_table[b, positions // page_size]  # (C,)
        slots = pages * page_size + positions % page_size  # (C,)
        k = k_cache.gather(slots, torch.float32)  # (C, KVH, D), dequantized
        v = v_cache.gather(slots, torch.float32)
        k = k.repeat_interleave(group, dim=1)  # (C, H, D): query head h reads KV head h // group
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,chd->htc", q[start:end].float(), k) * scale  # (H, T, C)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        query_pos = torch.arange(context_len - (end - start), context_len, device=q.device)
        visible = positions[None, :] <= query_pos[:, None]  # (T, C)
        if window is not None:
            visible &= positions[None, :] > query_pos[:, None] - window
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.einsum("htc,chd->thd", probs, v).to(q.dtype)
    return out

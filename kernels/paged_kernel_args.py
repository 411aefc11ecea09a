"""Checks and ctypes arguments shared by the C kernels over paged KV (kernels/cpu_decode_ops.py's decode
attention and KV stores, kernels/cpu_prefill_attention.py): the pages in the formats kv_formats.h reads,
the query and output rows, the page table, the (B,) index vectors, the window and soft cap. Each check
raises ValueError naming the argument and what it got."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.kv_format import KVPages

# kv_formats.h's format codes
KV_FORMAT_CODES = {"float32": 0, "bfloat16": 1, "int8": 2}
_F32 = torch.float32
_I64 = torch.int64


def check_caches(k_cache: KVPages, v_cache: KVPages) -> tuple[int, int, int, int]:
    """(num_pages, page_size, KVH, D) of two caches of one shape, contiguous on the CPU in a format the
    kernels read (kv_formats.h), D % 8 == 0."""
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        values = cache.values
        if (cache.kv_dtype not in KV_FORMAT_CODES or not values.is_cpu or values.dim() != 4
                or not values.is_contiguous() or (cache.scales is not None and not cache.scales.is_contiguous())):
            raise ValueError(f"{name} must be contiguous (num_pages, page_size, KVH, D) CPU pages in one of "
                             f"{', '.join(KV_FORMAT_CODES)}, got {tuple(values.shape)} {cache.kv_dtype}, "
                             f"contiguous={values.is_contiguous()}")
    shape = k_cache.shape
    if v_cache.shape != shape:
        raise ValueError(f"k_cache {tuple(shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    num_pages, page_size, num_kv_heads, head_dim = shape
    if head_dim % 8 or head_dim == 0 or num_kv_heads == 0 or page_size == 0:
        raise ValueError(f"caches {tuple(shape)}: head_dim must be a positive multiple of 8")
    return num_pages, page_size, num_kv_heads, head_dim


def pages_args(cache: KVPages) -> tuple[int, int, int]:
    """kv_formats.h's kv_pages: values, scales (0: none), format code."""
    scales = 0 if cache.scales is None else cache.scales.data_ptr()
    return cache.values.data_ptr(), scales, KV_FORMAT_CODES[cache.kv_dtype]


def check_query(q: Tensor) -> tuple[int, int, int, int]:
    """(N, H, D, q.stride(0)) of q (N, H, D) float32 on the CPU with strides (any, D, 1)."""
    if q.dtype != _F32 or not q.is_cpu or q.dim() != 3:
        raise ValueError(f"q must be a (N, H, D) float32 CPU tensor, got {tuple(q.shape)} {q.dtype} on {q.device}")
    num_rows, num_heads, dim = q.shape
    q_strides = q.stride()
    if q_strides[2] != 1 or q_strides[1] != dim:
        raise ValueError(f"q needs strides (any, D={dim}, 1), got {q_strides}")
    return num_rows, num_heads, dim, q_strides[0]


def check_out(out: Tensor, q: Tensor) -> None:
    """out: contiguous float32 on the CPU, q's shape."""
    if out.dtype != _F32 or not out.is_cpu or out.shape != q.shape or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {tuple(q.shape)} float32 CPU tensor, got "
                         f"{tuple(out.shape)} {out.dtype}, contiguous={out.is_contiguous()}")


def check_page_table(page_table: Tensor) -> tuple[int, int]:
    """(B, max_pages) of a contiguous int64 CPU page table."""
    if page_table.dtype != _I64 or not page_table.is_cpu or page_table.dim() != 2 or not page_table.is_contiguous():
        raise ValueError(f"page_table must be a contiguous (B, max_pages) int64 CPU tensor, got "
                         f"{tuple(page_table.shape)} {page_table.dtype}")
    num_seqs, max_pages = page_table.shape
    return num_seqs, max_pages


def check_index(name: str, t: Tensor, length: int) -> None:
    if t.dtype != _I64 or not t.is_cpu or t.shape != (length,) or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous ({length},) int64 CPU tensor, got {tuple(t.shape)} {t.dtype}")


def check_window_softcap(window: int | None, softcap: float | None) -> None:
    if (window is not None and window < 1) or (softcap is not None and softcap <= 0):
        raise ValueError(f"window must be >= 1 and softcap > 0 (or None), got {window}, {softcap}")

"""Paged prefill attention in C for the CPU (kernels/csrc/prefill_attention.c).

A prefill chunk's query rows attend to their sequence's cached prefix and to the chunk itself
(causal; a sliding window and Gemma 2's score soft cap when the layer has them), reading K and V
from the pages in their stored format (kernels/kv_format.py: float32, bfloat16, int8), one key tile
of one KV head converted at a time: no gather, no dequantized copy of the pool, no (rows x keys)
score matrix. Flash-attention style: tiles of 64 keys, online softmax in float32; the G query heads
of a KV head go together so each K/V tile is read once for all of them; work items are
(sequence, KV head, tile of ~256 / G rows; ~512 / G in the AMX build), in parallel over OpenMP. The torch path
(kernels/paged_attention.py: SDPA over gathered K/V) and `paged_attention_reference` stay the
reference the tests compare against.

Builds (kernels/native_build.py), one C source written with vector extensions: "avx512_vnni" (16-lane
AVX-512 code; it uses AVX-512F), "avx2" (AVX2 + FMA) and "portable" (plain C, any CPU with a C
compiler). `load` takes the best this CPU runs at or below the variant asked for, else the portable
build; `instruction_set` names it. Those are float32 throughout. `load_amx` is the fourth build,
"amx_bf16": the scores and P V products on AMX tiles in bf16 (Q, K, P, V rounded to nearest even,
float32 accumulation, softmax in float32), what prefill runs where a model's projections prefill over GGUF
blocks in bf16 products (kernels/bf16_products.py) and the backend is not told otherwise
(EngineConfig.prefill_attention).

A row's result does not depend on the batch or on how its prefill was cut into chunks (its key tiles
are aligned to multiples of 64 positions, and a tile it cannot see changes nothing), within one build.
"""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import torch
from torch import Tensor

from kernels.cpu_features import PORTABLE
from kernels.kernel_program import note_unrecorded
from kernels.kv_format import KVPages, as_pages
from kernels.native_build import FIND_COMPILER, NativeUnavailable, library_variant, load_library
from kernels.paged_kernel_args import (check_caches, check_index, check_out, check_page_table, check_query,
                                       check_window_softcap, pages_args)

__all__ = ["AMX_BF16", "CpuPrefillAttention", "load", "load_amx"]

AMX_BF16 = "amx_bf16"  # load_amx's instruction_set
MAX_HEAD_DIM = 256  # prefill_attention.c's limits
MAX_GROUP = 64  # query heads per KV head
_ARGS = struct.Struct("<18qd5qd").pack  # paged_prefill_attention_packed's fields (floats as double)
_ERRORS = {
    1: "sequence {b}'s query rows are not rows of q/out (or it has none)",
    2: "context_lens[{b}] is outside [query_lens[{b}], max_pages * page_size]",
    3: "page_table[{b}] holds a page id outside the cache (within its context)",
}


class CpuPrefillAttention:
    """The loaded kernel. Thread count: torch's (`torch.get_num_threads()`), read on every call;
    small work runs on the calling thread."""

    def __init__(self, library: ctypes.CDLL, instruction_set: str, arithmetic: str = ""):
        self.instruction_set = instruction_set  # "amx_bf16", "avx512_vnni", "avx2" or "portable"
        # how it multiplies, where that is not float32 throughout (the AMX build's bf16 products)
        self.arithmetic = arithmetic
        self._attention = library.paged_prefill_attention_packed
        self._attention.argtypes = [ctypes.c_char_p]
        self._attention.restype = ctypes.c_int64

    def describe(self) -> str:
        """The build, and its arithmetic where that is not float32 throughout."""
        return f"{self.instruction_set}: {self.arithmetic}" if self.arithmetic else self.instruction_set

    @staticmethod
    def fits(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
        """Whether attention of these sizes is within the kernel's limits."""
        return (num_kv_heads > 0 and num_heads % num_kv_heads == 0 and num_heads // num_kv_heads <= MAX_GROUP
                and 0 < head_dim <= MAX_HEAD_DIM and head_dim % 8 == 0)

    def paged_prefill_attention(
        self, q: Tensor, k_cache: Tensor | KVPages, v_cache: Tensor | KVPages, page_table: Tensor,
        q_starts: Tensor, query_lens: Tensor, context_lens: Tensor, scale: float, out: Tensor,
        window: int | None = None, softcap: float | None = None,
    ) -> None:
        """Sequence b's T_b = query_lens[b] query rows are rows q_starts[b] .. + T_b of q, at positions
        C_b - T_b .. C_b - 1 (C_b = context_lens[b]); row i sees positions <= C_b - T_b + i of its
        pages (and, with a window W, none W or more behind it), scores times `scale`, then
        softcap * tanh(s / softcap) with a soft cap; their K/V (the chunk's own included) already in
        the caches. Writes those rows of `out`, no other.

        q (N, H, D) float32 with strides (any, D, 1) (a view of qkv serves); out (N, H, D) contiguous
        float32; caches (num_pages, page_size, KVH, D) contiguous CPU pages in any KV format;
        page_table (B, max_pages) int64 contiguous; q_starts, query_lens, context_lens (B,) int64
        contiguous. Bad shapes raise ValueError; so do indices outside q, out or the caches (checked
        in C before anything is written)."""
        k_cache, v_cache = as_pages(k_cache), as_pages(v_cache)
        num_pages, page_size, num_kv_heads, head_dim = check_caches(k_cache, v_cache)
        num_rows, num_heads, dim, q_row_stride = check_query(q)
        if dim != head_dim or not self.fits(num_heads, num_kv_heads, head_dim):
            raise ValueError(f"q {tuple(q.shape)} with caches of KVH={num_kv_heads}, D={head_dim} do not fit the "
                             f"kernel (whole groups of at most {MAX_GROUP}, D a multiple of 8 up to {MAX_HEAD_DIM})")
        check_out(out, q)
        num_seqs, max_pages = check_page_table(page_table)
        for name, index in (("q_starts", q_starts), ("query_lens", query_lens), ("context_lens", context_lens)):
            check_index(name, index, num_seqs)
        check_window_softcap(window, softcap)
        note_unrecorded("paged_prefill_attention")
        status = self._attention(_ARGS(
            q.data_ptr(), q_row_stride, *pages_args(k_cache), *pages_args(v_cache), page_table.data_ptr(),
            max_pages, q_starts.data_ptr(), query_lens.data_ptr(), context_lens.data_ptr(), num_seqs, num_heads,
            num_kv_heads, dim, page_size, scale, out.data_ptr(), num_rows, num_pages, torch.get_num_threads(),
            window or 0, softcap or 0.0))
        if status:
            if status < 0:
                raise ValueError("paged_prefill_attention: sizes outside the kernel's limits, or out of memory")
            raise ValueError(_ERRORS[status % 4].format(b=status // 4))


def load(build_dir: Path, compiler: str | None = FIND_COMPILER, variant: str = "avx2",
         portable: bool = False) -> CpuPrefillAttention:
    """The build for `variant` (kernels.cpu_features) where this CPU runs it, else (or with `portable`)
    the plain-C one; built once, cached by source hash. Raises native_build.NativeUnavailable where
    none can be built (no C compiler)."""
    if not portable and variant != PORTABLE:
        try:
            return CpuPrefillAttention(load_library("prefill_attention", build_dir, compiler, variant),
                                       library_variant("prefill_attention", variant))
        except NativeUnavailable:
            pass
    return CpuPrefillAttention(load_library("prefill_attention_portable", build_dir, compiler), PORTABLE)


def load_amx(build_dir: Path, compiler: str | None = FIND_COMPILER) -> CpuPrefillAttention:
    """The AMX build (bf16 products). Raises native_build.NativeUnavailable where the CPU lacks
    AMX-TILE/AMX-BF16/AVX512_BF16, there is no compiler, or Linux does not grant the tile state."""
    library = load_library("prefill_attention_amx", build_dir, compiler, "avx512_vnni")
    ready = library.prefill_attention_amx_ready
    ready.argtypes, ready.restype = [], ctypes.c_int64
    if ready() != 0:
        raise NativeUnavailable("prefill_attention_amx: Linux did not grant the AMX tile state (arch_prctl)")
    return CpuPrefillAttention(library, AMX_BF16, "bf16 products on AMX tiles, float32 softmax")

"""Fused float32 C kernels for the small ops of a CPU decode step.

Around its matvecs a decode step runs ~7 small torch ops per layer (RMSNorm,
residual adds, RoPE, store_kv, the attention gather + SDPA, silu * mul), each
paying torch's dispatch and allocation costs on a few hundred floats. These
kernels do each group in one call: 3-9x faster than the torch ops for one
token, 2-3x for decode attention over 16 sequences (docs/performance.md); what
is left per call is mostly Python (checks, the output allocation), and the
arguments go packed in one bytes object rather than as ~10-18 ctypes arguments.

The kernels live in kernels/csrc/row_ops.c and decode_attention.c (AVX2 + FMA +
OpenMP, float32 only), built into one library once per source hash by `native_build.load_library` and called
through ctypes. `load()` raises native_build.NativeUnavailable where they cannot
run (not x86-64, no AVX2/FMA, no compiler); callers then keep the torch ops in kernels/, which stay
the reference the tests compare against (rms_norm_reference, silu_and_mul,
RotaryEmbedding.apply + store_kv, paged_attention_reference).

Every method checks dtypes, shapes and strides and raises ValueError rather
than hand C a pointer it would misread; indices that point into memory (slot
ids, page ids, rows, context lengths) are checked by the C side, which returns
an error before writing anything. Per call: a handful of attribute reads, at
most one output allocation and one ctypes call; no .item(), no temporaries.
"""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import torch
from torch import Tensor

from kernels import native_build
from kernels.kernel_program import PackedKernel, bind_runner
from kernels.kv_format import KVPages, as_pages
from kernels.paged_kernel_args import (check_caches, check_index, check_out, check_page_table, check_query,
                                       check_window_softcap, pages_args)

__all__ = ["CpuDecodeOps", "load"]

# Attention limits of the C kernel (per-task accumulators live on the stack).
MAX_GROUP = 64  # query heads per KV head
MAX_HEADS_DIM = 8192  # num_heads * head_dim

_F32 = torch.float32
# Argument packs of the C entry points `<name>_packed` (8-byte fields in parameter
# order; floats as double): one bytes argument instead of ~10-18 ctypes conversions.
_RMS_NORM_ARGS = struct.Struct("<5qdq").pack
_ADD_RMS_NORM_ARGS = struct.Struct("<6qdq").pack
_SILU_AND_MUL_ARGS = struct.Struct("<5q").pack
_QK_NORM_ARGS = struct.Struct("<7qdq").pack
_ADD_BIAS_ARGS = struct.Struct("<4q").pack
_ROPE_STORE_KV_ARGS = struct.Struct("<17q").pack
_REROTATE_STORE_KV_ARGS = struct.Struct("<17q").pack
_ATTENTION_ARGS = struct.Struct("<17qd5qd").pack
MAX_KV_ROW = 8192  # num_kv_heads * head_dim of a re-rotated quantized K row (row_ops.c, on the stack)
MAX_HEAD_DIM = 256  # a dequantized block of one head (decode_attention.c, on the stack)
_ATTENTION_ERRORS = {
    1: "rows[{b}] is not a row of q/out",
    2: "context_lens[{b}] is outside [1, max_pages * page_size]",
    3: "page_table[{b}] holds a page id outside the cache (within its context)",
}


class CpuDecodeOps:
    """The loaded kernels; see each method for the tensors it accepts.

    All tensors: float32 (int64 for indices) on the CPU. The thread count is
    torch's (`torch.get_num_threads()`), read on every call; small work runs on
    the calling thread without an OpenMP fork.
    """

    def __init__(self, library: ctypes.CDLL):
        self.library = library  # also exports the unpacked functions (kernels/csrc)
        self._rms_norm = PackedKernel(library.rms_norm_f32_packed)
        self._add_rms_norm = PackedKernel(library.add_rms_norm_f32_packed)
        self._silu_and_mul = PackedKernel(library.silu_and_mul_f32_packed)
        self._gelu_tanh_and_mul = PackedKernel(library.gelu_tanh_and_mul_f32_packed)
        self._qk_norm = PackedKernel(library.qk_norm_f32_packed)
        self._add_bias = PackedKernel(library.add_bias_f32_packed)
        self._rope_store_kv = PackedKernel(library.rope_store_kv_packed)
        self._rerotate_store_kv = PackedKernel(library.rerotate_store_kv_packed)
        self._attention = PackedKernel(library.paged_decode_attention_packed)
        self.run_program = bind_runner(library)  # runs a recorded step (kernels/kernel_program.py)

    # ------------------------------------------------------------ predicates

    @staticmethod
    def fits(hidden_size: int, intermediate_size: int, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
        """Whether a model of these sizes is within the kernels' limits: every
        width a multiple of 8, whole query-head groups, and the attention
        kernel's group size limits."""
        if num_kv_heads <= 0 or num_heads % num_kv_heads:
            return False
        return (
            hidden_size > 0
            and hidden_size % 8 == 0
            and intermediate_size > 0
            and intermediate_size % 8 == 0
            and head_dim > 0
            and head_dim % 8 == 0
            and num_heads // num_kv_heads <= MAX_GROUP
            and num_heads * head_dim <= MAX_HEADS_DIM
        )

    # -------------------------------------------------------------- the ops

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float, out: Tensor | None = None) -> Tensor:
        """x (..., d) contiguous, weight (d,) contiguous, d % 8 == 0 -> (..., d):
        x / sqrt(mean(x^2) + eps) * weight per row (statistics in double). Into
        `out` (contiguous, x's shape; may be x itself) when given, else a new tensor."""
        dim = _check_rows("x", x)
        _check_vector("weight", weight, dim)
        out = torch.empty_like(x) if out is None else _check_out(out, x.shape)
        self._rms_norm(_RMS_NORM_ARGS(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // dim, dim, eps,
                                      torch.get_num_threads()))
        return out

    def add_rms_norm(
        self, residual: Tensor, x: Tensor, weight: Tensor, eps: float, out: Tensor | None = None
    ) -> Tensor:
        """residual += x in place, then returns rms_norm(residual, weight, eps), into
        `out` (contiguous, x's shape; may be x itself) when given, else a new tensor.
        residual and x (..., d) contiguous of one shape, weight (d,)."""
        dim = _check_rows("residual", residual)
        _check_rows("x", x)
        if x.shape != residual.shape:
            raise ValueError(f"x {tuple(x.shape)} and residual {tuple(residual.shape)} differ in shape")
        _check_vector("weight", weight, dim)
        out = torch.empty_like(x) if out is None else _check_out(out, x.shape)
        self._add_rms_norm(_ADD_RMS_NORM_ARGS(residual.data_ptr(), x.data_ptr(), weight.data_ptr(), out.data_ptr(),
                                              x.numel() // dim, dim, eps, torch.get_num_threads()))
        return out

    def qk_norm(self, qkv: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float, num_heads: int) -> Tensor:
        """Qwen3's and Gemma 3's q/k norms, in place: qkv (N, H + 2*KVH, D) contiguous, its first H heads of
        each row normed over their D values with q_weight (D,), the next KVH with k_weight (D,), as rms_norm
        norms a row; the v heads stay. D % 8 == 0. Returns qkv."""
        if qkv.dtype != _F32 or not qkv.is_cpu or qkv.dim() != 3 or not qkv.is_contiguous():
            raise ValueError(f"qkv must be a contiguous (N, H + 2*KVH, D) float32 CPU tensor, got "
                             f"{tuple(qkv.shape)} {qkv.dtype}, contiguous={qkv.is_contiguous()}")
        rows, heads, dim = qkv.shape
        num_kv_heads = (heads - num_heads) // 2
        if dim % 8 or num_heads < 1 or num_kv_heads < 1 or num_heads + 2 * num_kv_heads != heads:
            raise ValueError(f"qkv {tuple(qkv.shape)} does not hold {num_heads} q heads and equal k and v heads "
                             f"of a multiple of 8 values")
        _check_vector("q_weight", q_weight, dim)
        _check_vector("k_weight", k_weight, dim)
        self._qk_norm(_QK_NORM_ARGS(qkv.data_ptr(), rows, num_heads, num_kv_heads, dim, q_weight.data_ptr(),
                                    k_weight.data_ptr(), eps, torch.get_num_threads()))
        return qkv

    def add_bias(self, y: Tensor, bias: Tensor) -> Tensor:
        """y (M, out) contiguous += bias (out,), in place (the same bits as torch's y + bias). Returns y."""
        cols = _check_rows("y", y, multiple=1)
        _check_vector("bias", bias, cols)
        self._add_bias(_ADD_BIAS_ARGS(y.data_ptr(), bias.data_ptr(), y.numel() // cols, cols))
        return y

    def silu_and_mul(self, gate_up: Tensor, out: Tensor | None = None) -> Tensor:
        """gate_up (..., 2*I) contiguous, I % 8 == 0 -> (..., I): silu(gate) * up, gate
        the first half of the last dimension. Into `out` (contiguous (..., I), not
        overlapping gate_up) when given, else a new tensor."""
        return self._gated(self._silu_and_mul, gate_up, out)

    @staticmethod
    def _gated(kernel, gate_up: Tensor, out: Tensor | None) -> Tensor:
        width = _check_rows("gate_up", gate_up, multiple=16)
        inter, rows = width // 2, gate_up.numel() // width
        if out is None:
            out = torch.empty(rows, inter)  # ints, not a shape tuple: half the cost
            if gate_up.dim() != 2:
                out = out.view(*gate_up.shape[:-1], inter)
        else:
            _check_out(out, (*gate_up.shape[:-1], inter))
        kernel(_SILU_AND_MUL_ARGS(gate_up.data_ptr(), out.data_ptr(), rows, inter, torch.get_num_threads()))
        return out

    def gelu_tanh_and_mul(self, gate_up: Tensor, out: Tensor | None = None) -> Tensor:
        """GeGLU: as silu_and_mul, with gelu (tanh approximation) for silu."""
        return self._gated(self._gelu_tanh_and_mul, gate_up, out)

    def rope_store_kv(
        self, qkv: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor | KVPages, v_cache: Tensor | KVPages,
        slot_ids: Tensor
    ) -> None:
        """Rotates the q and k heads of qkv in place and writes each row's k and v heads
        into its slot of the caches.

        qkv (N, H + 2*KVH, D) contiguous: q heads, then k heads, then v heads.
        cos, sin (N, R) or (N, 1, R) contiguous (RotaryEmbedding.cos_sin's rows): the leading R <= D
        dimensions of each head rotate (R even), the rest stay.
        k_cache, v_cache (num_pages, page_size, KVH, D) contiguous, one shape: float32 tensors, or
            KVPages of any format (kernels/kv_format.py; int8 quantized on store).
        slot_ids (N,) int64 contiguous, each in [0, num_pages * page_size).
        D % 8 == 0. Out-of-range slot ids raise ValueError with nothing modified.
        """
        k_cache, v_cache = as_pages(k_cache), as_pages(v_cache)
        num_pages, page_size, num_kv_heads, head_dim = check_caches(k_cache, v_cache)
        if qkv.dtype != _F32 or not qkv.is_cpu or qkv.dim() != 3 or not qkv.is_contiguous():
            raise ValueError(f"qkv must be a contiguous (N, H + 2*KVH, D) float32 CPU tensor, got "
                             f"{tuple(qkv.shape)} {qkv.dtype} on {qkv.device}, contiguous={qkv.is_contiguous()}")
        rows, heads, dim = qkv.shape
        num_heads = heads - 2 * num_kv_heads
        if dim != head_dim or num_heads < 1:
            raise ValueError(f"qkv {tuple(qkv.shape)} does not fit caches with KVH={num_kv_heads}, D={head_dim}")
        rotary_dim = _rotary_dim(cos, dim)
        _check_table("cos", cos, rows, rotary_dim)
        _check_table("sin", sin, rows, rotary_dim)
        check_index("slot_ids", slot_ids, rows)
        bad = self._rope_store_kv(_ROPE_STORE_KV_ARGS(
            qkv.data_ptr(), rows, num_heads, num_kv_heads, dim, cos.data_ptr(), sin.data_ptr(),
            *pages_args(k_cache), *pages_args(v_cache), slot_ids.data_ptr(), num_pages * page_size,
            torch.get_num_threads(), rotary_dim))
        if bad:
            raise ValueError(f"slot_ids[{bad - 1}] is outside the cache's {num_pages * page_size} slots")

    def rerotate_store_kv(self, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor | KVPages,
                          v_cache: Tensor | KVPages, slot_ids: Tensor) -> None:
        """Writes k rotated by one position delta and v as is into slots slot_ids of the caches
        (stored document KV placed at a new position); k and v are not modified.

        k, v (T, KVH, D) contiguous; cos, sin (R,) or (1, 1, R) contiguous (rotary.rerotation_cos_sin; R <= D);
        caches (num_pages, page_size, KVH, D) float32 or KVPages of any format (a quantized K is rotated in
        float32, then quantized); slot_ids (T,) int64. Bad slot ids raise ValueError, nothing written.
        """
        k_cache, v_cache = as_pages(k_cache), as_pages(v_cache)
        num_pages, page_size, num_kv_heads, head_dim = check_caches(k_cache, v_cache)
        if num_kv_heads * head_dim > MAX_KV_ROW:
            raise ValueError(f"{num_kv_heads} KV heads of {head_dim} exceed the kernel's {MAX_KV_ROW}-float row")
        for name, t in (("k", k), ("v", v)):
            if t.dtype != _F32 or not t.is_cpu or t.shape[1:] != (num_kv_heads, head_dim) or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous (T, {num_kv_heads}, {head_dim}) float32 CPU tensor, "
                                 f"got {tuple(t.shape)} {t.dtype}")
        if v.shape != k.shape:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ in shape")
        rows = k.shape[0]
        rotary_dim = _rotary_dim(cos, head_dim)
        _check_table("cos", cos.view(1, rotary_dim), 1, rotary_dim)
        _check_table("sin", sin.view(1, rotary_dim), 1, rotary_dim)
        check_index("slot_ids", slot_ids, rows)
        bad = self._rerotate_store_kv(_REROTATE_STORE_KV_ARGS(
            k.data_ptr(), v.data_ptr(), rows, num_kv_heads, head_dim, cos.data_ptr(), sin.data_ptr(),
            *pages_args(k_cache), *pages_args(v_cache), slot_ids.data_ptr(), num_pages * page_size,
            torch.get_num_threads(), rotary_dim))
        if bad:
            raise ValueError(f"slot_ids[{bad - 1}] is outside the cache's {num_pages * page_size} slots")

    def paged_decode_attention(
        self,
        q: Tensor,
        k_cache: Tensor | KVPages,
        v_cache: Tensor | KVPages,
        page_table: Tensor,
        context_lens: Tensor,
        rows: Tensor,
        scale: float,
        out: Tensor,
        window: int | None = None,
        softcap: float | None = None,
    ) -> None:
        """Decode attention, one query token per sequence, written into out.

        Sequence b's query is q[rows[b]] (H, D); it attends to its positions
        0..context_lens[b]-1, position p in slot page_table[b, p // page_size] *
        page_size + p % page_size; query head h reads KV head h // (H // KVH).
        The result goes to out[rows[b]]; other rows of out are left as they are. With a
        sliding `window` W the row sees only its last W positions; with a `softcap` its
        scores become softcap * tanh(score / softcap) before the softmax (Gemma 2).
        Softmax in float32 with the running max subtracted (online, per block of
        64 positions).

        q (N, H, D) float32 with q.stride(2) == 1 and q.stride(1) == D; q.stride(0)
            is free (a view such as qkv[:, :H] of a (N, H + 2*KVH, D) tensor works).
        k_cache, v_cache (num_pages, page_size, KVH, D) contiguous, one shape: float32 tensors, or KVPages
            of any format (bfloat16 and int8 dequantized a block of one head at a time), D <= 256.
        page_table (B, max_pages) int64 contiguous; context_lens, rows (B,) int64
            contiguous. D % 8 == 0, H % KVH == 0, H // KVH <= 64, H * D <= 8192.
        out (N, H, D) float32 contiguous, not overlapping q.
        Bad rows, context lengths or page ids raise ValueError with out untouched.
        """
        k_cache, v_cache = as_pages(k_cache), as_pages(v_cache)
        num_pages, page_size, num_kv_heads, head_dim = check_caches(k_cache, v_cache)
        if head_dim > MAX_HEAD_DIM:
            raise ValueError(f"head_dim {head_dim} exceeds the kernel's {MAX_HEAD_DIM}")
        num_rows, num_heads, dim, q_row_stride = check_query(q)
        if dim != head_dim or num_heads % num_kv_heads:
            raise ValueError(f"q {tuple(q.shape)} does not fit caches with KVH={num_kv_heads}, D={head_dim}")
        if num_heads // num_kv_heads > MAX_GROUP or num_heads * dim > MAX_HEADS_DIM:
            raise ValueError(f"{num_heads} heads of size {dim} in groups of {num_heads // num_kv_heads} exceed the "
                             f"kernel's limits ({MAX_GROUP} per group, {MAX_HEADS_DIM} floats in all)")
        check_out(out, q)
        num_seqs, max_pages = check_page_table(page_table)
        check_window_softcap(window, softcap)
        check_index("context_lens", context_lens, num_seqs)
        check_index("rows", rows, num_seqs)
        status = self._attention(_ATTENTION_ARGS(
            q.data_ptr(), q_row_stride, *pages_args(k_cache), *pages_args(v_cache), page_table.data_ptr(), max_pages,
            context_lens.data_ptr(), rows.data_ptr(), num_seqs, num_heads, num_kv_heads, dim, page_size, scale,
            out.data_ptr(), num_rows, num_pages, torch.get_num_threads(), window or 0, softcap or 0.0))
        if status:
            if status < 0:
                raise ValueError("paged_decode_attention: sizes outside the kernel's limits, or out of memory")
            raise ValueError(_ATTENTION_ERRORS[status % 4].format(b=status // 4))


def load(build_dir: Path, compiler: str | None = native_build.FIND_COMPILER, variant: str = "avx2") -> CpuDecodeOps:
    """Build (once, cached by source hash) and load the kernels (kernels.cpu_features variant, or
    the best below it they have); raises native_build.NativeUnavailable where they cannot run here."""
    return CpuDecodeOps(native_build.load_library("decode_ops", build_dir, compiler, variant))


def _check_rows(name: str, t: Tensor, multiple: int = 8) -> int:
    """t (..., d) contiguous float32 on the CPU with d % multiple == 0; returns d."""
    if t.dtype != _F32 or not t.is_cpu or t.dim() == 0 or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous (..., d) float32 CPU tensor, got {tuple(t.shape)} "
                         f"{t.dtype} on {t.device}, contiguous={t.is_contiguous()}")
    dim = t.shape[-1]
    if dim % multiple or dim == 0:
        raise ValueError(f"{name}'s last dimension ({dim}) must be a positive multiple of {multiple}")
    return dim


def _check_out(out: Tensor, shape) -> Tensor:
    if out.dtype != _F32 or not out.is_cpu or out.shape != shape or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {tuple(shape)} float32 CPU tensor, got {tuple(out.shape)} "
                         f"{out.dtype}, contiguous={out.is_contiguous()}")
    return out


def _check_vector(name: str, t: Tensor, dim: int) -> None:
    if t.dtype != _F32 or not t.is_cpu or t.shape != (dim,) or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous ({dim},) float32 CPU tensor, got {tuple(t.shape)} {t.dtype}")


def _rotary_dim(cos: Tensor, head_dim: int) -> int:
    """The rotary dimensions R of a cos table (its last dimension): even, 0 < R <= head_dim."""
    rotary_dim = cos.shape[-1] if cos.dim() else 0
    if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
        raise ValueError(f"a rotary table must be an even 1..{head_dim} wide, got {tuple(cos.shape)}")
    return rotary_dim


def _check_table(name: str, t: Tensor, rows: int, dim: int) -> None:
    """A (rows, dim) or (rows, 1, dim) contiguous float32 rotary table."""
    shape = t.shape
    if (t.dtype != _F32 or not t.is_cpu or not t.is_contiguous()
            or (shape != (rows, dim) and shape != (rows, 1, dim))):
        raise ValueError(f"{name} must be a contiguous ({rows}, {dim}) or ({rows}, 1, {dim}) float32 CPU tensor, "
                         f"got {tuple(shape)} {t.dtype}, contiguous={t.is_contiguous()}")

"""Fixtures of the kernel tests: the C kernels, loaded once or the test skipped;
thread counts; decode-attention cases over shuffled pages."""

import math
import zlib

import pytest
import torch

from kernels import cpu_decode_ops, cpu_matvec
from kernels.native_build import NativeUnavailable
from kernels.attention_inputs import AttentionInputs, slot_ids_of
from kernels.paged_attention import store_kv
from kernels.paged_attention_reference import paged_attention_reference


def _load_or_skip(load, tmp_path_factory, name: str):
    try:
        return load(tmp_path_factory.mktemp(name))
    except NativeUnavailable as error:
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def ops(tmp_path_factory):
    """The fused decode-step kernels (kernels/cpu_decode_ops.py)."""
    return _load_or_skip(cpu_decode_ops.load, tmp_path_factory, "decode_ops")


@pytest.fixture(scope="session")
def matvec(tmp_path_factory):
    """The matrix-vector kernels (kernels/cpu_matvec.py)."""
    return _load_or_skip(cpu_matvec.load, tmp_path_factory, "matvec")


@pytest.fixture(params=[1, 4], ids=["1-thread", "4-threads"])
def num_threads(request):
    """Runs a test on the calling thread alone and with an OpenMP team (4 threads
    even on 2 cores, so the parallel paths run wherever the tests do)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _gen(*seed):
    return torch.Generator().manual_seed(zlib.crc32(repr(seed).encode()))


@pytest.fixture
def decode_case():
    """`_decode_case` (see below): caches, decode-only inputs, q and the reference output."""
    return _decode_case


def _decode_case(context_lens, page_size, num_heads, num_kv_heads, head_dim, seed=0, extra_rows=0):
    """Caches holding each sequence's context in shuffled pages (NaN elsewhere, so a
    read of an unwritten slot shows), the decode-only AttentionInputs, q (B, H, D)
    and the reference output."""
    gen = _gen("attn", seed, tuple(context_lens), page_size, num_heads, num_kv_heads, head_dim)
    pages_per_seq = [math.ceil(c / page_size) for c in context_lens]
    num_pages = sum(pages_per_seq) + 3
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"))
    v_cache = torch.full(shape, float("nan"))
    free = torch.randperm(num_pages, generator=gen).tolist()
    page_ids, last_slots = [], []
    for context_len, count in zip(context_lens, pages_per_seq):
        pages, free = free[:count], free[count:]
        page_ids.append(pages)
        slots = torch.tensor(slot_ids_of(pages, 0, context_len, page_size))
        k = torch.randn(context_len, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(context_len, num_kv_heads, head_dim, generator=gen)
        store_kv(k_cache, v_cache, k, v, slots)
        last_slots.append(int(slots[-1]))
    inputs = AttentionInputs.build(last_slots, [1] * len(context_lens), context_lens, page_ids, "cpu")
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=gen) * 2
    scale = head_dim**-0.5
    expected = paged_attention_reference(q, k_cache, v_cache, inputs, scale)
    return q, k_cache, v_cache, inputs, scale, expected

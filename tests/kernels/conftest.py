"""Fixtures of the kernel tests: the C kernels, loaded once or the test skipped;
thread counts; decode-attention cases over shuffled pages."""

import math

import pytest
import torch

from kernels import cpu_decode_ops, cpu_matvec
from kernels.native_build import NativeUnavailable
from kernels.attention_inputs import AttentionInputs
from kernels.paged_attention import store_kv
from kernels.paged_attention_reference import paged_attention_reference
from tests.kernels.paged_layout import lay_out, seeded


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


@pytest.fixture
def decode_case():
    """`_decode_case` (see below): caches, decode-only inputs, q and the reference output."""
    return _decode_case


def _decode_case(context_lens, page_size, num_heads, num_kv_heads, head_dim, seed=0, extra_rows=0):
    """Caches holding each sequence's context in shuffled pages (NaN elsewhere, so a
    read of an unwritten slot shows), the decode-only AttentionInputs, q (B, H, D)
    and the reference output."""
    gen = seeded("attn", seed, tuple(context_lens), page_size, num_heads, num_kv_heads, head_dim)
    num_pages = sum(math.ceil(c / page_size) for c in context_lens) + 3
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"))
    v_cache = torch.full(shape, float("nan"))

    def write(slots, context_len):
        k = torch.randn(context_len, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(context_len, num_kv_heads, head_dim, generator=gen)
        store_kv(k_cache, v_cache, k, v, slots)

    page_ids, last_slots = lay_out([(c, 1) for c in context_lens], page_size, num_pages, gen, write)
    inputs = AttentionInputs.build(last_slots, [1] * len(context_lens), context_lens, page_ids, "cpu")
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=gen) * 2
    scale = head_dim**-0.5
    expected = paged_attention_reference(q, k_cache, v_cache, inputs, scale)
    return q, k_cache, v_cache, inputs, scale, expected

"""The decode ops' AVX-512 build gives the AVX2 build's bits (kernels/csrc/decode_attention.c's wider P V
products and bf16 reads, row_ops.c compiled with AVX-512): the AVX2 build is the one the other kernel tests
check against torch, so equal bits carry their checks over."""

import pytest
import torch

from kernels import cpu_decode_ops
from kernels.cpu_features import VARIANTS, this_cpu
from kernels.kv_format import KVPages
from kernels.native_build import NativeUnavailable
from tests.kernels.paged_layout import as_format, seeded

AVX512 = "avx512_vnni"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    if not this_cpu().has(*VARIANTS[AVX512][0]):
        pytest.skip(f"this CPU has no {AVX512} build to compare")
    try:
        return [cpu_decode_ops.load(tmp_path_factory.mktemp(variant), variant=variant) for variant in (AVX512, "avx2")]
    except NativeUnavailable as error:
        pytest.skip(str(error))


# (H, KVH, D): D = 40 and 72 leave a vector of 8 past the AVX-512 build's vectors of 16
HEADS = [(9, 3, 64), (4, 2, 40), (8, 2, 72), (2, 1, 128)]


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", HEADS)
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("window, softcap", [(None, None), (100, 30.0)])
def test_decode_attention_is_the_same_bits_in_both_builds(builds, decode_case, num_threads, num_heads, num_kv_heads,
                                                          head_dim, kv_dtype, window, softcap):
    contexts = [1, 17, 700, 64, 2100]
    q, k_cache, v_cache, inputs, scale, _ = decode_case(contexts, 16, num_heads, num_kv_heads, head_dim)
    k_pages, v_pages = as_format(k_cache, kv_dtype), as_format(v_cache, kv_dtype)
    # one more row over the third sequence's pages: rows of a batch over one prefix
    page_table = torch.cat([inputs.page_table, inputs.page_table[2:3]])
    context_lens = torch.tensor([*contexts, contexts[2]])
    q = torch.cat([q, q[:1]])
    outs = []
    for ops in builds:
        out = torch.full_like(q, float("nan"))
        ops.paged_decode_attention(q, k_pages, v_pages, page_table, context_lens, torch.arange(q.shape[0]), scale, out,
                                   window=window, softcap=softcap)
        outs.append(out)
    assert not outs[0].isnan().any()
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "int8"])
def test_row_ops_are_the_same_bits_in_both_builds(builds, kv_dtype):
    gen = seeded("rows", kv_dtype)
    rows, hidden, inter, num_heads, num_kv_heads, head_dim = 5, 576, 1536, 9, 3, 64
    x, residual = torch.randn(rows, hidden, generator=gen) * 3, torch.randn(rows, hidden, generator=gen)
    weight = torch.randn(hidden, generator=gen)
    gate_up = torch.randn(rows, 2 * inter, generator=gen) * 4
    qkv = torch.randn(rows, num_heads + 2 * num_kv_heads, head_dim, generator=gen)
    cos, sin = torch.randn(rows, head_dim, generator=gen), torch.randn(rows, head_dim, generator=gen)
    q_weight, k_weight = torch.randn(head_dim, generator=gen), torch.randn(head_dim, generator=gen)
    results = []
    for ops in builds:
        own_residual, own_qkv = residual.clone(), qkv.clone()
        k_cache, v_cache = (KVPages.zeros(kv_dtype, (2, 16, num_kv_heads, head_dim), "cpu") for _ in range(2))
        normed = ops.add_rms_norm(own_residual, x, weight, 1e-5)
        ops.rope_store_kv(own_qkv, cos, sin, k_cache, v_cache, torch.tensor([3, 17, 0, 31, 8]))
        ops.qk_norm(own_qkv, q_weight, k_weight, 1e-6, num_heads)
        results.append([ops.rms_norm(x, weight, 1e-5), normed, own_residual, ops.silu_and_mul(gate_up),
                        ops.gelu_tanh_and_mul(gate_up), own_qkv, *k_cache.planes, *v_cache.planes])
    for first, second in zip(*results):
        assert torch.equal(first, second)

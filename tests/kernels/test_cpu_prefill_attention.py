"""Paged prefill attention in C (kernels/cpu_prefill_attention.py) against the torch reference, every
build this machine runs (portable always; AVX2, AVX-512 and AMX where the CPU has them), every KV format.
The AMX build multiplies in bf16: its reference is the same attention over inputs rounded to bf16."""

import math

import pytest
import torch

from kernels import cpu_prefill_attention
from kernels.cpu_prefill_attention import AMX_BF16
from kernels.attention_inputs import AttentionInputs
from kernels.attention_plan import CPU_ATTENTION, AttentionPolicy
from kernels.cpu_features import PORTABLE, VARIANTS, this_cpu
from kernels.kv_format import C_KV_DTYPES, KVPages
from kernels.native_build import NativeUnavailable
from kernels.paged_attention import paged_attention, paged_attention_reference
from tests.kernels.paged_layout import lay_out, seeded

BUILDS = (*VARIANTS, PORTABLE, AMX_BF16)  # "avx512_vnni", "avx2", "portable", "amx_bf16"
TOLERANCE = dict(atol=1e-5, rtol=1e-5)  # float32 sums in another order than the reference's
# bf16 P (2^-9 relative) and exp to ~1e-4, against a reference over the same bf16 inputs (seen: 2.6e-3 at most)
AMX_TOLERANCE = dict(atol=1e-2, rtol=1e-2)
CASES = {
    "causal": [(100, 100)],
    "after a prefix": [(300, 37)],
    "batch": [(300, 37), (17, 17), (129, 64), (1000, 200), (2, 2), (70, 1)],
    "one row a tile": [(64, 64), (65, 65), (130, 3)],
    "long": [(2100, 300)],
}


@pytest.fixture(scope="module", params=BUILDS)
def kernel(request, tmp_path_factory):
    build = request.param
    if build in VARIANTS and not this_cpu().has(*VARIANTS[build][0]):
        pytest.skip(f"this CPU lacks {build}")
    try:
        if build == AMX_BF16:
            loaded = cpu_prefill_attention.load_amx(tmp_path_factory.mktemp("prefill"))
        else:
            loaded = cpu_prefill_attention.load(tmp_path_factory.mktemp("prefill"), variant=build,
                                                portable=build == PORTABLE)
    except NativeUnavailable as error:
        pytest.skip(str(error))
    assert loaded.instruction_set == build
    return loaded


def _case(seqs, page_size=16, num_heads=9, num_kv_heads=3, head_dim=64, kv_dtype="float32", seed=0):
    """Sequences (context_len, query_len) over shuffled pages, in `kv_dtype`, NaN wherever no sequence
    wrote (values, or int8's scales), so a read of an unwritten slot shows. -> q, k, v, inputs."""
    gen = seeded(seqs, page_size, num_heads, num_kv_heads, head_dim, kv_dtype, seed)
    num_pages = sum(math.ceil(c / page_size) for c, _ in seqs) + 3
    dims = (num_pages, page_size, num_kv_heads, head_dim)
    caches = [KVPages.zeros(kv_dtype, dims, "cpu") for _ in range(2)]
    for cache in caches:
        (cache.scales if cache.scales is not None else cache.values).fill_(float("nan"))

    def write(slots, context_len):
        for cache in caches:
            cache.store(slots, torch.randn(context_len, num_kv_heads, head_dim, generator=gen))

    page_ids, new_slots = lay_out(seqs, page_size, num_pages, gen, write)
    inputs = AttentionInputs.build(new_slots, [q for _, q in seqs], [c for c, _ in seqs], page_ids, "cpu")
    q = torch.randn(inputs.num_tokens, num_heads, head_dim, generator=gen) * 2
    return q, caches[0], caches[1], inputs


def _run(kernel, q, k, v, inputs, scale, out=None, window=None, softcap=None):
    out = torch.full(q.shape, 7.0) if out is None else out
    kernel.paged_prefill_attention(q, k, v, inputs.page_table.contiguous(), torch.tensor(inputs.query_starts[:-1]),
                                   torch.tensor(inputs.query_lens), torch.tensor(inputs.context_lens), scale, out,
                                   window, softcap)
    return out


def _rounded_pages(pages: KVPages) -> torch.Tensor:
    """float32 pages (num_pages, page_size, KVH, D) of `pages`' values, dequantized, rounded to bf16."""
    slots = torch.arange(pages.shape[0] * pages.shape[1])
    return pages.gather(slots, torch.float32).bfloat16().float().view(pages.shape)


def _check(kernel, got, q, k, v, inputs, scale, rows=slice(None), **masks):
    """got (rows of it) against the reference: for the AMX build over its bf16 inputs (scale q, K and V rounded)."""
    if kernel.instruction_set == AMX_BF16:
        reference = paged_attention_reference((q * scale).bfloat16().float(), _rounded_pages(k), _rounded_pages(v),
                                              inputs, 1.0, **masks)
        torch.testing.assert_close(got[rows], reference[rows], **AMX_TOLERANCE)
    else:
        torch.testing.assert_close(got[rows], paged_attention_reference(q, k, v, inputs, scale, **masks)[rows],
                                   **TOLERANCE)


@pytest.mark.parametrize("kv_dtype", C_KV_DTYPES)
@pytest.mark.parametrize("seqs", CASES.values(), ids=CASES.keys())
def test_matches_the_reference(kernel, num_threads, kv_dtype, seqs):
    q, k, v, inputs = _case(seqs, kv_dtype=kv_dtype)
    _check(kernel, _run(kernel, q, k, v, inputs, 0.125), q, k, v, inputs, 0.125)


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(4, 4, 32), (8, 2, 64), (8, 1, 128), (6, 3, 72),
                                                               (2, 1, 256), (12, 4, 8)])
@pytest.mark.parametrize("page_size", [16, 5])
def test_head_shapes_and_page_sizes(kernel, num_heads, num_kv_heads, head_dim, page_size):
    """Groups of 1..8, D from 8 to 256 (72: not whole AVX-512 vectors), pages of 5 (no tile boundary falls
    on a page boundary)."""
    for kv_dtype in ("float32", "bfloat16"):
        q, k, v, inputs = _case(CASES["batch"], page_size, num_heads, num_kv_heads, head_dim, kv_dtype)
        _check(kernel, _run(kernel, q, k, v, inputs, head_dim**-0.5), q, k, v, inputs, head_dim**-0.5)


@pytest.mark.parametrize("kv_dtype", C_KV_DTYPES)
@pytest.mark.parametrize("window, softcap", [(50, None), (None, 30.0), (64, 20.0), (1, None), (5000, None)])
def test_sliding_windows_and_soft_caps(kernel, num_threads, kv_dtype, window, softcap):
    """Gemma 2's soft cap, the sliding windows of Gemma 2/3, Mistral, Phi-3 (a window of one: each row sees
    itself; one beyond every context: hides nothing)."""
    q, k, v, inputs = _case(CASES["batch"] + [(700, 300)], kv_dtype=kv_dtype, seed=1)
    got = _run(kernel, q, k, v, inputs, 0.125, window=window, softcap=softcap)
    _check(kernel, got, q, k, v, inputs, 0.125, window=window, softcap=softcap)


@pytest.mark.parametrize("window", [None, 40])
def test_a_rows_bits_do_not_depend_on_chunks_or_batch(kernel, num_threads, window):
    """One prefill of 300 tokens whole, in three chunks (each after the previous as its cached prefix), and
    batched beside other sequences: the same bits for every row."""
    q, k, v, inputs = _case([(300, 300), (150, 90)], seed=2)
    whole = _run(kernel, q, k, v, inputs, 0.125, window=window)
    page_ids = inputs.page_table[0].tolist()
    for start, end in [(0, 100), (100, 237), (237, 300)]:
        chunk = AttentionInputs.for_chunks([(page_ids, start, end)], 16, "cpu")
        alone = _run(kernel, q[start:end].contiguous(), k, v, chunk, 0.125, window=window)
        assert torch.equal(alone, whole[start:end])


def test_reads_q_as_a_view_and_writes_only_its_rows(kernel):
    """q a view of the model's qkv (row stride (H + 2 KVH) D), the prefill rows between decode rows:
    the other rows of out stay as they were."""
    q, k, v, inputs = _case([(40, 1), (300, 37), (9, 1), (50, 50)], seed=3)
    qkv = torch.randn(q.shape[0], 9 + 6, 64)
    qkv[:, :9] = q
    prefill = [1, 3]
    rows = torch.cat([torch.arange(inputs.query_starts[b], inputs.query_starts[b + 1]) for b in prefill])
    out = torch.full(q.shape, 7.0)
    kernel.paged_prefill_attention(qkv[:, :9], k, v, inputs.page_table[prefill].contiguous(),
                                   torch.tensor([inputs.query_starts[b] for b in prefill]),
                                   torch.tensor([inputs.query_lens[b] for b in prefill]),
                                   torch.tensor([inputs.context_lens[b] for b in prefill]), 0.125, out)
    _check(kernel, out, q, k, v, inputs, 0.125, rows)
    untouched = torch.ones(q.shape[0], dtype=torch.bool)
    untouched[rows] = False
    assert torch.equal(out[untouched], torch.full_like(out[untouched], 7.0))


def test_bad_indices_raise_and_write_nothing(kernel):
    q, k, v, inputs = _case([(300, 37), (50, 50)], seed=4)
    args = (torch.tensor(inputs.query_starts[:-1]), torch.tensor(inputs.query_lens))
    out = torch.full(q.shape, 7.0)
    bad_pages = inputs.page_table.clone()
    bad_pages[1, 0] = k.shape[0]
    with pytest.raises(ValueError, match=r"page_table\[1\]"):
        kernel.paged_prefill_attention(q, k, v, bad_pages, *args, torch.tensor(inputs.context_lens), 0.125, out)
    with pytest.raises(ValueError, match=r"context_lens\[0\]"):
        kernel.paged_prefill_attention(q, k, v, inputs.page_table, *args, torch.tensor([30, 50]), 0.125, out)
    with pytest.raises(ValueError, match="query rows"):
        kernel.paged_prefill_attention(q, k, v, inputs.page_table, torch.tensor([0, 40]), args[1],
                                       torch.tensor(inputs.context_lens), 0.125, out)
    assert torch.equal(out, torch.full_like(out, 7.0))
    with pytest.raises(ValueError, match="out must be"):
        kernel.paged_prefill_attention(q, k, v, inputs.page_table, *args, torch.tensor(inputs.context_lens), 0.125,
                                       out.transpose(0, 1).contiguous().transpose(0, 1))
    with pytest.raises(ValueError, match="window"):
        kernel.paged_prefill_attention(q, k, v, inputs.page_table, *args, torch.tensor(inputs.context_lens), 0.125,
                                       out, window=0)


@pytest.mark.parametrize("window, softcap", [(None, None), (24, 2.0)])
def test_paged_attention_runs_prefills_through_the_kernel(kernel, window, softcap):
    """A step of decodes, a verify chunk and prefills under a fused-prefill policy: prefills in the C
    kernel, decodes through SDPA chunks; against the reference."""
    q, k, v, inputs = _case([(40, 1), (300, 37), (60, 23), (9, 1), (50, 50)], page_size=4, seed=5)
    policy = AttentionPolicy(64, 16, fused_prefill=True)
    assert inputs.plan(4, policy, window).prefill_batch is not None
    got = paged_attention(q, k, v, inputs, 0.125, policy, window=window, softcap=softcap, prefill_ops=kernel)
    prefill_rows = torch.cat([torch.arange(inputs.query_starts[b], inputs.query_starts[b + 1])
                              for b in range(len(inputs.query_lens)) if inputs.query_lens[b] > 1])
    decode_rows = torch.tensor([inputs.query_starts[b] for b in range(len(inputs.query_lens)) if inputs.query_lens[b] == 1])
    _check(kernel, got, q, k, v, inputs, 0.125, prefill_rows, window=window, softcap=softcap)
    torch.testing.assert_close(got[decode_rows], paged_attention_reference(q, k, v, inputs, 0.125, window=window,
                                                                           softcap=softcap)[decode_rows], **TOLERANCE)
    with pytest.raises(ValueError, match="prefill kernel"):
        paged_attention(q, k, v, inputs, 0.125, policy)
    assert inputs.plan(4, CPU_ATTENTION).prefill_batch is None

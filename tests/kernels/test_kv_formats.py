"""Quantized KV pages (kernels/kv_format.py): the reference quantization, and attention over each
format, torch path and C kernels, decode and prefill, windows and soft caps, against float32.

Tolerances (max abs error of attention outputs over unit-normal K and V, scores of q ~ N(0, 4)):
bfloat16 3e-2, int8 5e-2, float8 2.5e-1 (e4m3's 3 mantissa bits: a value's rounding is up to 1/16 of
itself, int8's 1/254 of its row's absmax; seen 0.17 at most on these cases). Reading a format is also
checked exactly: attention over quantized pages equals float32 attention over the same values
dequantized (1e-5), so any error is the format's. float8 is the torch backend's only (the C kernels
refuse it, with an error that names it).
"""

import math

import pytest
import torch

from kernels.attention_inputs import AttentionInputs
from kernels.attention_plan import CPU_ATTENTION, AttentionPolicy
from kernels.kv_format import (C_KV_DTYPES, FLOAT8_MAX, KV_DTYPES, UNOFFERED_KV_DTYPES, KVPages, StoredRows,
                               dequantize, quantize)
from kernels.paged_attention import paged_attention, paged_attention_reference, store_kv
from kernels.rotary import RotaryEmbedding
from tests.kernels.paged_layout import as_format, lay_out, seeded

FORMAT_TOLERANCE = {"float32": 1e-5, "bfloat16": 3e-2, "int8": 5e-2, "float8": 2.5e-1}
FUSED = AttentionPolicy(64, 16, fused_decode=True, max_rows_as_decode=4)


def _case(seqs, page_size=4, num_kv_heads=2, group=3, head_dim=32, seed=0):
    """Float32 caches over shuffled pages holding each sequence's context; (q, k_cache, v_cache, inputs)."""
    gen = seeded(seqs, page_size, num_kv_heads, group, head_dim, seed)
    num_pages = sum(math.ceil(c / page_size) for c, _ in seqs) + 2
    k_cache = torch.zeros(num_pages, page_size, num_kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)

    def write(slots, context_len):
        store_kv(k_cache, v_cache, torch.randn(context_len, num_kv_heads, head_dim, generator=gen),
                 torch.randn(context_len, num_kv_heads, head_dim, generator=gen), slots)

    page_ids, new_slots = lay_out(seqs, page_size, num_pages, gen, write)
    inputs = AttentionInputs.build(new_slots, [q for _, q in seqs], [c for c, _ in seqs], page_ids, "cpu")
    q = torch.randn(inputs.num_tokens, num_kv_heads * group, head_dim, generator=gen) * 2
    return q, k_cache, v_cache, inputs


def _dequantized(pages: KVPages) -> torch.Tensor:
    slots = torch.arange(pages.shape[0] * pages.shape[1])
    return pages.gather(slots, torch.float32).view(pages.shape)


def test_the_offered_formats_are_the_flags_choices():
    from engine.kv_dtype_config import KV_DTYPE_CHOICES, UNOFFERED_KV_DTYPES as CONFIG_UNOFFERED

    assert KV_DTYPE_CHOICES == KV_DTYPES and CONFIG_UNOFFERED == UNOFFERED_KV_DTYPES == ("float8",)


def test_int8_quantization_is_within_half_a_step_per_token_and_head():
    x = torch.randn(50, 3, 64, generator=seeded("q")) * torch.rand(50, 3, 1, generator=seeded("s")) * 5
    x[7, 1] = 0.0  # an all-zero row: scale 0, q 0
    q, scale = quantize("int8", x)
    assert q.dtype == torch.int8 and scale.shape == (50, 3) and int(q.abs().max()) <= 127
    assert torch.equal(scale, x.abs().amax(-1) / 127) and scale[7, 1] == 0 and not q[7, 1].any()
    error = (dequantize(q, scale) - x).abs()
    assert bool((error <= scale.unsqueeze(-1) / 2 + 1e-6).all())


def test_float8_quantization_is_e4m3_within_half_a_step_per_token_and_head():
    x = torch.randn(50, 3, 64, generator=seeded("f8")) * torch.rand(50, 3, 1, generator=seeded("f8s")) * 5
    x[7, 1] = 0.0  # an all-zero row: scale 0, q 0
    x[9, 2, :8] = 1e-6  # tiny values beside the row's absmax: e4m3 subnormals, or 0
    q, scale = quantize("float8", x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (50, 3)
    assert float(q.float().abs().max()) == FLOAT8_MAX  # each row's absmax lands on e4m3's largest value
    assert torch.equal(scale, x.abs().amax(-1) / FLOAT8_MAX) and scale[7, 1] == 0 and not q[7, 1].float().any()
    # round to nearest: within half a step, 2^-4 of the value for normals, 2^-10 of the scale below 2^-6
    error = (dequantize(q, scale) - x).abs()
    bound = torch.maximum(x.abs() / 16, scale.unsqueeze(-1) * 2.0 ** -10) * (1 + 1e-5)
    assert bool((error <= bound).all())


def test_float8_rows_are_moved_by_their_bytes():
    """store / gather / take_rows on float8 pages (torch's CPU index_copy_ has no float8 kernel): what
    take_rows copies out is the stored bytes, and dequantizes as gather does."""
    pages = KVPages.zeros("float8", (4, 4, 2, 16), "cpu")
    x = torch.randn(6, 2, 16, generator=seeded("bytes"))
    slots = torch.tensor([13, 0, 5, 6, 2, 9])
    pages.store(slots, x)
    rows = pages.take_rows(slots)
    assert isinstance(rows, StoredRows) and rows.values.dtype == torch.float8_e4m3fn and rows.num_bytes == 6 * 2 * 20
    assert torch.equal(rows.values.view(torch.uint8), quantize("float8", x)[0].view(torch.uint8))
    torch.testing.assert_close(rows.dequantized(torch.float32), pages.gather(slots, torch.float32), atol=0, rtol=0)
    torch.testing.assert_close(pages.gather(slots, torch.float32), x, atol=0.15, rtol=1 / 16)
    assert not pages.gather(torch.tensor([1, 15]), torch.float32).any()  # untouched slots stay zero


@pytest.mark.parametrize("kv_dtype", (*KV_DTYPES, *UNOFFERED_KV_DTYPES))
def test_pages_and_scales_cost_what_the_pool_counts(kv_dtype):
    from cache.kv_pool import KVPool, KVPoolShape

    shape = KVPoolShape(2, 3, 64, 16, torch.float32, kv_dtype, kv_dtype)
    pool = KVPool(shape, 5, "cpu")
    assert sum(plane.numel() * plane.element_size() for plane in pool.tier_planes) == pool.num_bytes
    assert shape.bytes_per_page == {"float32": 2 * 2 * 16 * 3 * 64 * 4, "bfloat16": 2 * 2 * 16 * 3 * 64 * 2,
                                    "int8": 2 * 2 * 16 * 3 * (64 + 4), "float8": 2 * 2 * 16 * 3 * (64 + 4)}[kv_dtype]


SEQS = [(20, 20), (45, 1), (50, 13), (7, 1), (33, 2), (60, 23), (100, 1)]


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("window, softcap", [(None, None), (5, None), (None, 2.0), (24, 2.0)])
@pytest.mark.parametrize("path", ["reference", "torch", "fused"])
def test_attention_over_each_format_matches_float32(kv_dtype, window, softcap, path, request):
    """Decodes, verify chunks and prefills (torch: SDPA / softcapped matmuls; fused: the C decode kernel for
    decodes and short chunks, SDPA for prefills) over K and V in the format."""
    q, k_cache, v_cache, inputs = _case(SEQS, seed=len(kv_dtype))
    scale = q.shape[-1] ** -0.5
    expected = paged_attention_reference(q, k_cache, v_cache, inputs, scale, window=window, softcap=softcap)
    k_pages, v_pages = as_format(k_cache, kv_dtype), as_format(v_cache, kv_dtype)
    if path == "reference":
        got = paged_attention_reference(q, k_pages, v_pages, inputs, scale, window=window, softcap=softcap)
    elif path == "torch":
        got = paged_attention(q, k_pages, v_pages, inputs, scale, CPU_ATTENTION, window=window, softcap=softcap)
    else:
        ops = request.getfixturevalue("ops")
        got = paged_attention(q, k_pages, v_pages, inputs, scale, FUSED, ops, window=window, softcap=softcap)
    tolerance = FORMAT_TOLERANCE[kv_dtype]
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=0)
    _assert_format_error_alone(got, q, k_pages, v_pages, inputs, scale, window, softcap)


@pytest.mark.parametrize("window, softcap", [(None, None), (5, None), (None, 2.0), (24, 2.0)])
@pytest.mark.parametrize("path", ["reference", "torch"])
def test_attention_over_float8_matches_float32(window, softcap, path):
    """float8 pages on the torch backend's paths (reference, and SDPA / softcapped matmuls in chunks)."""
    q, k_cache, v_cache, inputs = _case(SEQS, seed=6)
    scale = q.shape[-1] ** -0.5
    expected = paged_attention_reference(q, k_cache, v_cache, inputs, scale, window=window, softcap=softcap)
    k_pages, v_pages = as_format(k_cache, "float8"), as_format(v_cache, "float8")
    if path == "reference":
        got = paged_attention_reference(q, k_pages, v_pages, inputs, scale, window=window, softcap=softcap)
    else:
        got = paged_attention(q, k_pages, v_pages, inputs, scale, CPU_ATTENTION, window=window, softcap=softcap)
    torch.testing.assert_close(got, expected, atol=FORMAT_TOLERANCE["float8"], rtol=0)
    _assert_format_error_alone(got, q, k_pages, v_pages, inputs, scale, window, softcap)


def _assert_format_error_alone(got, q, k_pages, v_pages, inputs, scale, window, softcap):
    """The error is the format's alone: the same values dequantized give the same attention."""
    exact = paged_attention_reference(q, _dequantized(k_pages), _dequantized(v_pages), inputs, scale, window=window,
                                      softcap=softcap)
    torch.testing.assert_close(got, exact, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k_dtype, v_dtype", [("bfloat16", "float8"), ("float8", "float32"), ("float8", "int8")])
def test_k_and_v_in_different_formats_with_float8_on_the_torch_path(k_dtype, v_dtype):
    q, k_cache, v_cache, inputs = _case(SEQS, seed=8)
    scale = q.shape[-1] ** -0.5
    k_pages, v_pages = as_format(k_cache, k_dtype), as_format(v_cache, v_dtype)
    got = paged_attention(q, k_pages, v_pages, inputs, scale, CPU_ATTENTION)
    expected = paged_attention_reference(q, _dequantized(k_pages), _dequantized(v_pages), inputs, scale)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, paged_attention_reference(q, k_cache, v_cache, inputs, scale),
                               atol=FORMAT_TOLERANCE["float8"], rtol=0)


def test_the_c_kernels_refuse_float8_pages_by_name(ops):
    assert "float8" in UNOFFERED_KV_DTYPES and "float8" not in C_KV_DTYPES
    q, k_cache, v_cache, inputs = _case(SEQS, seed=9)
    with pytest.raises(ValueError, match="float8"):
        paged_attention(q, as_format(k_cache, "float8"), as_format(v_cache, "int8"), inputs, q.shape[-1] ** -0.5,
                        FUSED, ops)


@pytest.mark.parametrize("k_dtype, v_dtype", [("int8", "float32"), ("float32", "int8"), ("bfloat16", "int8")])
def test_k_and_v_in_different_formats(ops, k_dtype, v_dtype):
    q, k_cache, v_cache, inputs = _case(SEQS, seed=7)
    scale = q.shape[-1] ** -0.5
    k_pages, v_pages = as_format(k_cache, k_dtype), as_format(v_cache, v_dtype)
    expected = paged_attention_reference(q, _dequantized(k_pages), _dequantized(v_pages), inputs, scale)
    for got in (paged_attention(q, k_pages, v_pages, inputs, scale, CPU_ATTENTION),
                paged_attention(q, k_pages, v_pages, inputs, scale, FUSED, ops)):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_c_kernel_over_long_quantized_contexts(ops, kv_dtype, head_dim, num_threads):
    """Contexts long enough to be cut into pieces across threads (and merged), a last block of
    a length no multiple of 8, 3 query heads a KV head: the C kernel over the format equals float32
    attention over the same values dequantized; and it stays within the format's tolerance."""
    q, k_cache, v_cache, inputs = _case([(701, 1), (333, 1), (1, 1), (130, 3)], page_size=16, num_kv_heads=3,
                                        group=3, head_dim=head_dim, seed=head_dim)
    scale = head_dim ** -0.5
    k_pages, v_pages = as_format(k_cache, kv_dtype), as_format(v_cache, kv_dtype)
    got = paged_attention(q, k_pages, v_pages, inputs, scale, FUSED, ops)
    exact = paged_attention_reference(q, _dequantized(k_pages), _dequantized(v_pages), inputs, scale)
    torch.testing.assert_close(got, exact, atol=1e-5, rtol=1e-5)
    expected = paged_attention_reference(q, k_cache, v_cache, inputs, scale)
    torch.testing.assert_close(got, expected, atol=FORMAT_TOLERANCE[kv_dtype], rtol=0)


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int8"])
def test_the_c_store_quantizes_as_the_reference(ops, kv_dtype, num_threads):
    """rope_store_kv (q and k rotated, k and v stored) and rerotate_store_kv into pages of the format: the
    stored values are the reference's quantization of the same rotated rows (int8: at most one step apart
    where the rotation's last bit differs; scales within float rounding)."""
    gen = seeded("store", kv_dtype)
    num_heads, num_kv_heads, head_dim, rows = 6, 2, 64, 40
    qkv = torch.randn(rows, num_heads + 2 * num_kv_heads, head_dim, generator=gen)
    rotary = RotaryEmbedding(head_dim, 256, 10000.0, None, device="cpu")
    cos, sin = rotary.cos_sin(torch.arange(rows) + 3, torch.float32)
    slots = torch.randperm(64, generator=gen)[:rows]
    got_k, got_v = KVPages.zeros(kv_dtype, (16, 4, num_kv_heads, head_dim), "cpu"), \
        KVPages.zeros(kv_dtype, (16, 4, num_kv_heads, head_dim), "cpu")
    want_k, want_v = KVPages.zeros(kv_dtype, (16, 4, num_kv_heads, head_dim), "cpu"), \
        KVPages.zeros(kv_dtype, (16, 4, num_kv_heads, head_dim), "cpu")
    rotated = RotaryEmbedding.apply(qkv[:, : num_heads + num_kv_heads], cos, sin)
    store_kv(want_k, want_v, rotated[:, num_heads:], qkv[:, num_heads + num_kv_heads:], slots)
    q = qkv.clone()
    ops.rope_store_kv(q, cos, sin, got_k, got_v, slots)
    torch.testing.assert_close(q[:, :num_heads], rotated[:, :num_heads], atol=1e-5, rtol=1e-5)
    for got, want in ((got_k, want_k), (got_v, want_v)):
        assert int((got.values.float() - want.values.float()).abs().max()) <= (1 if kv_dtype == "int8" else 0) or \
            kv_dtype == "bfloat16" and torch.allclose(got.values.float(), want.values.float(), rtol=1e-2)
        if got.scales is not None:
            torch.testing.assert_close(got.scales, want.scales, atol=1e-6, rtol=1e-5)
    # document KV placed at a new position: k rotated, then quantized
    k, v = torch.randn(rows, num_kv_heads, head_dim, generator=gen), torch.randn(rows, num_kv_heads, head_dim,
                                                                                  generator=gen)
    delta_cos, delta_sin = cos[5:6], sin[5:6]
    ops.rerotate_store_kv(k, v, delta_cos, delta_sin, got_k, got_v, slots)
    store_kv(want_k, want_v, RotaryEmbedding.apply(k, delta_cos, delta_sin), v, slots)
    for got, want in ((got_k, want_k), (got_v, want_v)):
        torch.testing.assert_close(_dequantized(got), _dequantized(want), atol=0.02, rtol=0)


@pytest.mark.parametrize("k_dtype, v_dtype", [("float32", "float32"), ("bfloat16", "bfloat16"), ("int8", "int8"),
                                              ("int8", "bfloat16")])
@pytest.mark.parametrize("window", [None, 300])
def test_the_c_kernel_over_a_prefix_shared_by_the_batch(ops, k_dtype, v_dtype, window, num_threads):
    """Sequences of one batch over one cached prefix (the same first pages, then pages of their own; contexts
    ending inside the prefix, just past it and far past it; one of them twice; one unrelated sequence between
    them) are attended together, the prefix read once for all: each row gets the very bits it gets alone, and
    equals attention over the same values dequantized. The prefix ends inside a block of 64 positions, and a
    row that ends inside the prefix comes first."""
    page_size, num_kv_heads, group, head_dim = 16, 3, 3, 64
    prefix_pages, context_lens = 45, [700, 1500, 725, 2100, 33, 725, 1200, 64 * 16 + 5]
    gen = seeded("shared prefix", k_dtype, v_dtype, window)
    own_pages = [math.ceil(c / page_size) for c in context_lens]
    num_pages = prefix_pages + sum(own_pages)
    page_table = torch.zeros(len(context_lens), max(own_pages), dtype=torch.int64)
    next_page = prefix_pages
    for b, count in enumerate(own_pages):
        if b == 6:  # unrelated: all its pages its own
            page_table[b, :count] = torch.arange(next_page, next_page + count)
        else:
            shared = min(count, prefix_pages)
            page_table[b, :shared] = torch.arange(shared)
            page_table[b, shared:count] = torch.arange(next_page, next_page + count - shared)
        next_page += count
    page_table[5] = page_table[2]  # the same context and pages twice
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_pages = as_format(torch.randn(shape, generator=gen), k_dtype)
    v_pages = as_format(torch.randn(shape, generator=gen), v_dtype)
    q = torch.randn(len(context_lens), num_kv_heads * group, head_dim, generator=gen) * 2
    context = torch.tensor(context_lens)
    scale = head_dim ** -0.5
    together = torch.empty_like(q)
    ops.paged_decode_attention(q, k_pages, v_pages, page_table, context, torch.arange(len(context_lens)), scale,
                               together, window)
    for b in range(len(context_lens)):
        alone = torch.empty_like(q[b:b + 1])
        ops.paged_decode_attention(q[b:b + 1].contiguous(), k_pages, v_pages, page_table[b:b + 1].contiguous(),
                                   context[b:b + 1], torch.zeros(1, dtype=torch.int64), scale, alone, window)
        assert torch.equal(together[b], alone[0]), b
    last_slots = [int(page_table[b, (c - 1) // page_size]) * page_size + (c - 1) % page_size
                  for b, c in enumerate(context_lens)]
    inputs = AttentionInputs.build(
        last_slots, [1] * len(context_lens), context_lens,
        [page_table[b, :math.ceil(c / page_size)].tolist() for b, c in enumerate(context_lens)], "cpu")
    exact = paged_attention_reference(q, _dequantized(k_pages), _dequantized(v_pages), inputs, scale, window=window)
    torch.testing.assert_close(together, exact, atol=1e-5, rtol=1e-5)

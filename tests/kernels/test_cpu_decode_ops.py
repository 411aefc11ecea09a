"""The fused C decode ops (kernels/cpu_decode_ops.py) against the torch ops they replace."""

import ctypes
import math
import zlib

import pytest
import torch

from kernels import cpu_decode_ops
from kernels.activation import silu_and_mul
from kernels.attention_inputs import AttentionInputs
from kernels.paged_attention import store_kv
from kernels.paged_attention_reference import paged_attention_reference
from kernels.rms_norm import rms_norm_reference
from kernels.rotary import RotaryEmbedding

TOL = dict(rtol=1e-5, atol=1e-6)
HEADS = [(9, 3, 64), (4, 4, 32), (8, 2, 64), (8, 2, 32)]  # (H, KVH, D)


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    loaded = cpu_decode_ops.load(tmp_path_factory.mktemp("decode_ops"))
    if loaded is None:
        pytest.skip("no C compiler or no AVX2/FMA/F16C here")
    return loaded


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


# ------------------------------------------------------------------ RMSNorm


@pytest.mark.parametrize("rows", [1, 3, 17, 64])
@pytest.mark.parametrize("dim", [8, 64, 576])
def test_rms_norm_matches_reference(ops, num_threads, rows, dim):
    gen = _gen("rms", rows, dim)
    x = torch.randn(rows, dim, generator=gen) * 3
    weight = torch.randn(dim, generator=gen)
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5), **TOL)


def test_rms_norm_keeps_leading_dims(ops):
    x, weight = torch.randn(2, 3, 64), torch.randn(64)
    out = ops.rms_norm(x, weight, 1e-6)
    assert out.shape == (2, 3, 64)
    torch.testing.assert_close(out, rms_norm_reference(x, weight, 1e-6), **TOL)


@pytest.mark.parametrize("rows", [1, 3, 17, 64])
@pytest.mark.parametrize("dim", [64, 576])
def test_add_rms_norm_updates_residual_and_normalises(ops, num_threads, rows, dim):
    gen = _gen("add", rows, dim)
    residual = torch.randn(rows, dim, generator=gen)
    x = torch.randn(rows, dim, generator=gen)
    weight = torch.randn(dim, generator=gen)
    expected_residual = residual + x
    out = ops.add_rms_norm(residual, x, weight, 1e-5)
    assert torch.equal(residual, expected_residual)  # the same float additions
    torch.testing.assert_close(out, rms_norm_reference(expected_residual, weight, 1e-5), **TOL)


def test_norms_write_into_out(ops):
    x, weight, residual = torch.randn(3, 64), torch.randn(64), torch.randn(3, 64)
    expected = rms_norm_reference(x, weight, 1e-5)
    out = torch.empty(3, 64)
    assert ops.rms_norm(x, weight, 1e-5, out=out) is out
    torch.testing.assert_close(out, expected, **TOL)
    assert ops.rms_norm(x, weight, 1e-5, out=x) is x  # in place
    torch.testing.assert_close(x, expected, **TOL)

    x = torch.randn(3, 64)
    summed = residual + x
    assert ops.add_rms_norm(residual, x, weight, 1e-5, out=x) is x
    assert torch.equal(residual, summed)
    torch.testing.assert_close(x, rms_norm_reference(summed, weight, 1e-5), **TOL)


# ------------------------------------------------------------- SiLU and mul


@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("inter", [8, 64, 1536])
def test_silu_and_mul_matches_reference(ops, num_threads, rows, inter):
    gen = _gen("silu", rows, inter)
    gate_up = torch.randn(rows, 2 * inter, generator=gen) * 4
    torch.testing.assert_close(ops.silu_and_mul(gate_up), silu_and_mul(gate_up), **TOL)


def test_silu_and_mul_extreme_gates(ops):
    gate = torch.tensor([-1000.0, -100.0, -88.5, -87.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 87.0, 100.0, 1000.0,
                         -5.0, 5.0, 0.5, -0.5])
    gate_up = torch.cat([gate, torch.linspace(-2, 2, 16)])[None]  # (1, 32): I = 16
    out = ops.silu_and_mul(gate_up)
    torch.testing.assert_close(out, silu_and_mul(gate_up), **TOL)
    gate_up[0, 3] = float("nan")
    assert torch.isnan(ops.silu_and_mul(gate_up)[0, 3])


def test_silu_and_mul_keeps_leading_dims(ops):
    gate_up = torch.randn(2, 3, 32)
    out = ops.silu_and_mul(gate_up)
    assert out.shape == (2, 3, 16)
    torch.testing.assert_close(out, silu_and_mul(gate_up), **TOL)
    into = torch.empty(2, 3, 16)
    assert ops.silu_and_mul(gate_up, out=into) is into
    torch.testing.assert_close(into, silu_and_mul(gate_up), **TOL)


# ------------------------------------------------------------ RoPE + store


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", HEADS)
@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("table_rank", [3, 2])
def test_rope_store_kv_matches_rotary_and_store_kv(ops, num_threads, num_heads, num_kv_heads, head_dim, rows,
                                                   table_rank):
    gen = _gen("rope", num_heads, num_kv_heads, head_dim, rows)
    rotary = RotaryEmbedding(head_dim, 4096, 10000.0, None, "cpu")
    positions = torch.randint(0, 4096, (rows,), generator=gen)
    cos, sin = rotary.cos_sin(positions, torch.float32)  # (N, 1, D)
    if table_rank == 2:
        cos, sin = cos[:, 0].contiguous(), sin[:, 0].contiguous()
    qkv = torch.randn(rows, num_heads + 2 * num_kv_heads, head_dim, generator=gen)
    k_cache = torch.randn(8, 4, num_kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(8, 4, num_kv_heads, head_dim, generator=gen)
    slot_ids = torch.randperm(32, generator=gen)[:rows]

    expected_qk = RotaryEmbedding.apply(qkv[:, : num_heads + num_kv_heads], *rotary.cos_sin(positions, torch.float32))
    expected_v = qkv[:, num_heads + num_kv_heads :].clone()
    expected_k_cache, expected_v_cache = k_cache.clone(), v_cache.clone()
    store_kv(expected_k_cache, expected_v_cache, expected_qk[:, num_heads:], expected_v, slot_ids)

    ops.rope_store_kv(qkv, cos, sin, k_cache, v_cache, slot_ids)
    torch.testing.assert_close(qkv[:, : num_heads + num_kv_heads], expected_qk, **TOL)
    assert torch.equal(qkv[:, num_heads + num_kv_heads :], expected_v)
    torch.testing.assert_close(k_cache, expected_k_cache, **TOL)  # untouched slots equal too
    assert torch.equal(v_cache, expected_v_cache)


# ------------------------------------------------------- decode attention


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
        slots = torch.tensor([pages[p // page_size] * page_size + p % page_size for p in range(context_len)])
        k = torch.randn(context_len, num_kv_heads, head_dim, generator=gen)
        v = torch.randn(context_len, num_kv_heads, head_dim, generator=gen)
        store_kv(k_cache, v_cache, k, v, slots)
        last_slots.append(int(slots[-1]))
    inputs = AttentionInputs.build(last_slots, [1] * len(context_lens), context_lens, page_ids, "cpu")
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=gen) * 2
    scale = head_dim**-0.5
    expected = paged_attention_reference(q, k_cache, v_cache, inputs, scale)
    return q, k_cache, v_cache, inputs, scale, expected


CONTEXTS = {
    "1": [1],
    "15": [15],
    "16": [16],
    "17": [17],
    "300": [300],
    "mixed": [300, 1, 17, 16, 15, 64, 65, 2],
    "long": [2100, 40],
}


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", HEADS)
@pytest.mark.parametrize("page_size", [16, 4])
@pytest.mark.parametrize("contexts", CONTEXTS.values(), ids=CONTEXTS.keys())
def test_decode_attention_matches_reference(ops, num_threads, num_heads, num_kv_heads, head_dim, page_size, contexts):
    q, k_cache, v_cache, inputs, scale, expected = _decode_case(
        contexts, page_size, num_heads, num_kv_heads, head_dim
    )
    num_seqs = len(contexts)
    # rows out of sequence order, two rows no sequence owns, and q a view of a qkv
    # tensor (row stride (H + 2 * KVH) * D), as the model holds it
    num_rows = num_seqs + 2
    rows = torch.randperm(num_rows, generator=_gen("rows", num_seqs))[:num_seqs]
    qkv = torch.randn(num_rows, num_heads + 2 * num_kv_heads, head_dim)
    qkv[rows, :num_heads] = q
    out = torch.full((num_rows, num_heads, head_dim), 7.0)
    context_lens = torch.tensor(inputs.context_lens, dtype=torch.int64)

    ops.paged_decode_attention(qkv[:, :num_heads], k_cache, v_cache, inputs.page_table, context_lens, rows, scale, out)
    torch.testing.assert_close(out[rows], expected, rtol=1e-5, atol=1e-5)
    unused = torch.ones(num_rows, dtype=torch.bool)
    unused[rows] = False
    assert torch.equal(out[unused], torch.full_like(out[unused], 7.0))


def test_decode_attention_32k_context(ops, num_threads):
    q, k_cache, v_cache, inputs, scale, expected = _decode_case([33000, 700], 16, 9, 3, 64, seed=1)
    out = torch.empty_like(q)
    context_lens = torch.tensor(inputs.context_lens)
    ops.paged_decode_attention(q, k_cache, v_cache, inputs.page_table, context_lens, torch.arange(2), scale, out)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_decode_attention_peaked_scores(ops, num_threads):
    """Large logits: the running max must keep the softmax finite and exact."""
    q, k_cache, v_cache, inputs, _, _ = _decode_case([700, 5], 16, 8, 2, 32, seed=2)
    scale = 3.0  # logits in the hundreds
    expected = paged_attention_reference(q, k_cache, v_cache, inputs, scale)
    out = torch.empty_like(q)
    context_lens = torch.tensor(inputs.context_lens)
    ops.paged_decode_attention(q, k_cache, v_cache, inputs.page_table, context_lens, torch.arange(2), scale, out)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_decode_attention_after_rope_store_kv(ops):
    """The two ops chained as a decode step runs them: rope + store, then attention
    on a q view of the same qkv, against the torch ops."""
    num_heads, num_kv_heads, head_dim, page_size = 9, 3, 64, 16
    context_lens = [40, 17, 1]
    _, k_cache, v_cache, inputs, scale, _ = _decode_case(context_lens, page_size, num_heads, num_kv_heads, head_dim)
    rotary = RotaryEmbedding(head_dim, 128, 10000.0, None, "cpu")
    cos, sin = rotary.cos_sin(inputs.positions, torch.float32)
    qkv = torch.randn(3, num_heads + 2 * num_kv_heads, head_dim)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()

    qk = RotaryEmbedding.apply(qkv[:, : num_heads + num_kv_heads], cos, sin)
    store_kv(k_ref, v_ref, qk[:, num_heads:], qkv[:, num_heads + num_kv_heads :], inputs.slot_ids)
    expected = paged_attention_reference(qk[:, :num_heads], k_ref, v_ref, inputs, scale)

    ops.rope_store_kv(qkv, cos, sin, k_cache, v_cache, inputs.slot_ids)
    out = torch.empty(3, num_heads, head_dim)
    context_lens = torch.tensor(context_lens)
    ops.paged_decode_attention(qkv[:, :num_heads], k_cache, v_cache, inputs.page_table, context_lens,
                               torch.arange(3), scale, out)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_unpacked_c_functions(ops):
    """The library's plain C signatures (what the packed entry points forward to)."""
    lib = ops.library
    P, I = ctypes.c_void_p, ctypes.c_int64
    lib.rms_norm_f32.argtypes = [P, P, P, I, I, ctypes.c_float, ctypes.c_int]
    lib.rms_norm_f32.restype = None
    x, weight, out = torch.randn(3, 64), torch.randn(64), torch.empty(3, 64)
    lib.rms_norm_f32(x.data_ptr(), weight.data_ptr(), out.data_ptr(), 3, 64, 1e-5, 2)
    torch.testing.assert_close(out, rms_norm_reference(x, weight, 1e-5), **TOL)

    lib.paged_decode_attention_f32.argtypes = [P, I, P, P, P, I, P, P, I, I, I, I, I, ctypes.c_float, P, I, I,
                                               ctypes.c_int]
    lib.paged_decode_attention_f32.restype = ctypes.c_int64
    q, k_cache, v_cache, inputs, scale, expected = _decode_case([40, 3], 16, 9, 3, 64)
    context_lens, rows, out = torch.tensor(inputs.context_lens), torch.arange(2), torch.empty(2, 9, 64)
    status = lib.paged_decode_attention_f32(
        q.data_ptr(), 9 * 64, k_cache.data_ptr(), v_cache.data_ptr(), inputs.page_table.data_ptr(),
        inputs.page_table.shape[1], context_lens.data_ptr(), rows.data_ptr(), 2, 9, 3, 64, 16, scale, out.data_ptr(),
        2, k_cache.shape[0], 2)
    assert status == 0
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------- predicates


def test_supports_and_fits():
    ops_class = cpu_decode_ops.CpuDecodeOps
    assert ops_class.supports(torch.float32, torch.device("cpu"))
    assert ops_class.supports(torch.float32, "cpu")
    assert not ops_class.supports(torch.bfloat16, "cpu")
    assert not ops_class.supports(torch.float32, "meta")
    assert ops_class.fits(576, 1536, 9, 3, 64)
    assert not ops_class.fits(580, 1536, 9, 3, 64)  # hidden not a multiple of 8
    assert not ops_class.fits(576, 1540, 9, 3, 64)
    assert not ops_class.fits(576, 1536, 9, 3, 60)  # head_dim not a multiple of 8
    assert not ops_class.fits(576, 1536, 9, 4, 64)  # heads not in whole groups
    assert not ops_class.fits(576, 1536, 128, 1, 64)  # group beyond the kernel's limit
    assert not ops_class.fits(576, 1536, 256, 64, 64)  # heads * head_dim beyond the kernel's limit


# ------------------------------------------------------------- bad inputs


def test_norm_and_silu_reject_bad_inputs(ops):
    x, weight = torch.randn(2, 64), torch.randn(64)
    bad = {
        "float64": (x.double(), weight),
        "bfloat16": (x.bfloat16(), weight),
        "weight dtype": (x, weight.double()),
        "weight shape": (x, torch.randn(32)),
        "not contiguous": (torch.randn(64, 2).t(), weight),
        "dim not multiple of 8": (torch.randn(2, 12), torch.randn(12)),
        "scalar": (torch.tensor(1.0), weight),
    }
    for name, (x_bad, weight_bad) in bad.items():
        with pytest.raises(ValueError):
            ops.rms_norm(x_bad, weight_bad, 1e-5)
    residual = torch.randn(2, 64)
    before = residual.clone()
    for args in [(residual, torch.randn(3, 64), weight), (residual, x.double(), weight),
                 (torch.randn(64, 2).t(), x, weight), (residual, x, torch.randn(65))]:
        with pytest.raises(ValueError):
            ops.add_rms_norm(*args, 1e-5)
    assert torch.equal(residual, before)
    for gate_up in [torch.randn(2, 24), torch.randn(2, 32).double(), torch.randn(32, 2).t(), torch.tensor(1.0)]:
        with pytest.raises(ValueError):
            ops.silu_and_mul(gate_up)
    for out in [torch.empty(2, 32), torch.empty(2, 64, dtype=torch.float64), torch.empty(64, 2).t()]:
        with pytest.raises(ValueError):
            ops.rms_norm(x, weight, 1e-5, out=out)
        with pytest.raises(ValueError):
            ops.add_rms_norm(residual, x, weight, 1e-5, out=out)
    for out in [torch.empty(2, 32), torch.empty(2, 16, dtype=torch.float64), torch.empty(16, 2).t()]:
        with pytest.raises(ValueError):
            ops.silu_and_mul(torch.randn(2, 32), out=out)
    assert torch.equal(residual, before)


def _rope_inputs(rows=3):
    qkv = torch.randn(rows, 9 + 2 * 3, 64)
    cos, sin = torch.randn(rows, 1, 64), torch.randn(rows, 1, 64)
    k_cache, v_cache = torch.zeros(4, 16, 3, 64), torch.zeros(4, 16, 3, 64)
    slot_ids = torch.tensor([0, 5, 63])
    return dict(qkv=qkv, cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache, slot_ids=slot_ids)


def test_rope_store_kv_rejects_bad_inputs(ops):
    good = _rope_inputs()
    ops.rope_store_kv(**good)
    changes = {
        "qkv dtype": dict(qkv=good["qkv"].double()),
        "qkv heads": dict(qkv=torch.randn(3, 6, 64)),  # no room for a q head
        "qkv head_dim": dict(qkv=torch.randn(3, 15, 32)),
        "qkv not contiguous": dict(qkv=torch.randn(3, 64, 15).transpose(1, 2)),
        "cos rows": dict(cos=torch.randn(2, 1, 64)),
        "cos not contiguous": dict(cos=torch.randn(64, 3).t()),
        "sin dtype": dict(sin=good["sin"].double()),
        "cache dtype": dict(k_cache=torch.zeros(4, 16, 3, 64, dtype=torch.float64)),
        "cache shapes differ": dict(v_cache=torch.zeros(5, 16, 3, 64)),
        "cache not contiguous": dict(k_cache=torch.zeros(16, 4, 3, 64).transpose(0, 1)),
        "slot dtype": dict(slot_ids=torch.tensor([0, 5, 63], dtype=torch.int32)),
        "slot count": dict(slot_ids=torch.tensor([0, 5])),
    }
    for name, change in changes.items():
        with pytest.raises(ValueError):
            ops.rope_store_kv(**{**_rope_inputs(), **change})


@pytest.mark.parametrize("bad_slot", [64, -1, 10**12])
def test_rope_store_kv_rejects_slots_outside_the_cache_untouched(ops, bad_slot):
    inputs = _rope_inputs()
    inputs["slot_ids"] = torch.tensor([0, bad_slot, 3])
    before = {name: t.clone() for name, t in inputs.items()}
    with pytest.raises(ValueError, match=r"slot_ids\[1\]"):
        ops.rope_store_kv(**inputs)
    for name, t in inputs.items():
        assert torch.equal(t, before[name]), name


def _attention_inputs():
    q, k_cache, v_cache, inputs, scale, _ = _decode_case([20, 5], 16, 9, 3, 64)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, page_table=inputs.page_table,
                context_lens=torch.tensor(inputs.context_lens), rows=torch.arange(2), scale=scale,
                out=torch.zeros(2, 9, 64))


def test_decode_attention_rejects_bad_inputs(ops):
    good = _attention_inputs()
    ops.paged_decode_attention(**good)
    num_pages = good["k_cache"].shape[0]
    changes = {
        "q dtype": dict(q=good["q"].double()),
        "q head stride": dict(q=torch.randn(2, 64, 9).transpose(1, 2)),
        "q inner stride": dict(q=torch.randn(2, 9, 128)[:, :, ::2]),
        "q heads not in groups": dict(q=torch.randn(2, 8, 64), out=torch.zeros(2, 8, 64)),
        "q head_dim": dict(q=torch.randn(2, 9, 32), out=torch.zeros(2, 9, 32)),
        "too many heads": dict(q=torch.randn(2, 129, 64), out=torch.zeros(2, 129, 64)),
        "out shape": dict(out=torch.zeros(3, 9, 64)),
        "out dtype": dict(out=torch.zeros(2, 9, 64, dtype=torch.float64)),
        "out not contiguous": dict(out=torch.zeros(9, 2, 64).transpose(0, 1)),
        "cache not contiguous": dict(v_cache=good["v_cache"].transpose(0, 1).contiguous().transpose(0, 1)),
        "page_table dtype": dict(page_table=good["page_table"].int()),
        "page_table rows": dict(page_table=good["page_table"][:1]),
        "context_lens dtype": dict(context_lens=torch.tensor([20, 5], dtype=torch.int32)),
        "context_lens count": dict(context_lens=torch.tensor([20])),
        "rows not contiguous": dict(rows=torch.tensor([0, 9, 1])[::2]),
        "row outside q": dict(rows=torch.tensor([0, 2])),
        "negative row": dict(rows=torch.tensor([-1, 1])),
        "empty context": dict(context_lens=torch.tensor([20, 0])),
        "context beyond page table": dict(context_lens=torch.tensor([20, 33])),
        "page id outside cache": dict(page_table=torch.tensor([[0, 1], [num_pages, 0]])),
        "negative page id": dict(page_table=torch.tensor([[0, -1], [2, 0]])),
    }
    for name, change in changes.items():
        inputs = {**_attention_inputs(), **change}
        out_before = inputs["out"].clone()
        with pytest.raises(ValueError):
            ops.paged_decode_attention(**inputs)
        assert torch.equal(inputs["out"], out_before), name

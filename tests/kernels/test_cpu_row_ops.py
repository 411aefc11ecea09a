"""The fused row ops of a decode step (kernels/cpu_decode_ops.py: RMSNorm, residual add +
RMSNorm, SiLU*mul, RoPE + KV store) against the torch ops they replace."""

import ctypes
import zlib

import pytest
import torch

from kernels import cpu_decode_ops
from kernels.activation import gelu_tanh_and_mul, silu_and_mul
from kernels.paged_attention import store_kv
from kernels.rms_norm import rms_norm_reference
from kernels.rotary import RotaryEmbedding

TOL = dict(rtol=1e-5, atol=1e-6)
HEADS = [(9, 3, 64), (4, 4, 32), (8, 2, 64), (8, 2, 32)]  # (H, KVH, D)


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


@pytest.mark.parametrize("rows", [1, 5, 300])
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(4, 2, 64), (16, 8, 128), (3, 1, 8)])
def test_qk_norm_norms_q_and_k_heads_in_place_as_rms_norm_does_rows(ops, num_threads, rows, num_heads,
                                                                     num_kv_heads, head_dim):
    gen = _gen("qk", rows, num_heads, head_dim)
    qkv = torch.randn(rows, num_heads + 2 * num_kv_heads, head_dim, generator=gen) * 3
    q_weight, k_weight = torch.randn(head_dim, generator=gen), torch.randn(head_dim, generator=gen)
    q, k, v = (qkv[:, :num_heads].clone(), qkv[:, num_heads:num_heads + num_kv_heads].clone(),
               qkv[:, num_heads + num_kv_heads:].clone())
    out = ops.qk_norm(qkv, q_weight, k_weight, 1e-6, num_heads)
    assert out is qkv
    # each head exactly as the row kernel norms a row (the cpu backend's q/k norms before this kernel)
    assert torch.equal(qkv[:, :num_heads], ops.rms_norm(q, q_weight, 1e-6))
    assert torch.equal(qkv[:, num_heads:num_heads + num_kv_heads], ops.rms_norm(k, k_weight, 1e-6))
    assert torch.equal(qkv[:, num_heads + num_kv_heads:], v)
    torch.testing.assert_close(qkv[:, :num_heads], rms_norm_reference(q, q_weight, 1e-6), **TOL)


def test_qk_norm_refuses_what_it_would_misread(ops):
    with pytest.raises(ValueError, match="contiguous"):
        ops.qk_norm(torch.randn(2, 8, 16)[:, :6], torch.ones(16), torch.ones(16), 1e-6, 2)
    with pytest.raises(ValueError, match="does not hold"):
        ops.qk_norm(torch.randn(2, 7, 16), torch.ones(16), torch.ones(16), 1e-6, 2)
    with pytest.raises(ValueError, match="k_weight"):
        ops.qk_norm(torch.randn(2, 8, 16), torch.ones(16), torch.ones(8), 1e-6, 2)


@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 96), (17, 1000)])
def test_add_bias_adds_in_place_with_torchs_bits(ops, rows, cols):
    y, bias = torch.randn(rows, cols), torch.randn(cols)
    expected = y + bias
    assert ops.add_bias(y, bias) is y and torch.equal(y, expected)
    with pytest.raises(ValueError, match="bias"):
        ops.add_bias(y, torch.randn(cols + 1))


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


@pytest.mark.parametrize("rows", [1, 17])
@pytest.mark.parametrize("inter", [8, 64, 1536])
def test_gelu_tanh_and_mul_matches_reference(ops, num_threads, rows, inter):
    gen = _gen("gelu", rows, inter)
    gate_up = torch.randn(rows, 2 * inter, generator=gen) * 4
    torch.testing.assert_close(ops.gelu_tanh_and_mul(gate_up), _gelu_exact(gate_up), **TOL)


def _gelu_exact(gate_up):
    """The reference in float64: in float32, torch's 1 + tanh(u) loses the digits of a negative gate's
    small result (the kernel's equal x * sigmoid(2u) keeps them)."""
    return gelu_tanh_and_mul(gate_up.double()).float()


def test_gelu_tanh_and_mul_extreme_gates(ops):
    gate = torch.tensor([-1e20, -1000.0, -100.0, -20.0, -3.0, -1e-3, 0.0, 1e-3, 3.0, 20.0, 100.0, 1000.0, 1e20,
                         -0.5, 0.5, 7.0])
    gate_up = torch.cat([gate, torch.linspace(-2, 2, 16)])[None]  # (1, 32): I = 16
    torch.testing.assert_close(ops.gelu_tanh_and_mul(gate_up), _gelu_exact(gate_up), **TOL)
    gate_up[0, 3] = float("nan")
    assert torch.isnan(ops.gelu_tanh_and_mul(gate_up)[0, 3])


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
@pytest.mark.parametrize("rotary_part", [0, 8, 16], ids=["whole", "part-8", "part-16"])
def test_rope_store_kv_matches_rotary_and_store_kv(ops, num_threads, num_heads, num_kv_heads, head_dim, rows,
                                                   table_rank, rotary_part):
    """rotary_part: the head's last dimensions that do not rotate (partial rotary, Phi-3/4)."""
    gen = _gen("rope", num_heads, num_kv_heads, head_dim, rows)
    rotary = RotaryEmbedding(head_dim, 4096, 10000.0, None, "cpu", rotary_dim=head_dim - rotary_part)
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


def test_unpacked_rms_norm(ops):
    """The library's plain C signature (what the packed entry point forwards to)."""
    lib = ops.library
    P, I = ctypes.c_void_p, ctypes.c_int64
    lib.rms_norm_f32.argtypes = [P, P, P, I, I, ctypes.c_float, ctypes.c_int]
    lib.rms_norm_f32.restype = None
    x, weight, out = torch.randn(3, 64), torch.randn(64), torch.empty(3, 64)
    lib.rms_norm_f32(x.data_ptr(), weight.data_ptr(), out.data_ptr(), 3, 64, 1e-5, 2)
    torch.testing.assert_close(out, rms_norm_reference(x, weight, 1e-5), **TOL)


# ------------------------------------------------------------- predicates


def test_fits():
    ops_class = cpu_decode_ops.CpuDecodeOps
    assert ops_class.fits(576, 1536, 9, 3, 64)
    assert not ops_class.fits(580, 1536, 9, 3, 64)  # hidden not a multiple of 8
    assert not ops_class.fits(576, 1540, 9, 3, 64)
    assert not ops_class.fits(576, 1536, 9, 3, 60)  # head_dim not a multiple of 8
    assert not ops_class.fits(576, 1536, 9, 4, 64)  # heads not in whole groups
    assert not ops_class.fits(576, 1536, 128, 1, 64)  # group beyond the kernel's limit
    assert not ops_class.fits(576, 1536, 256, 64, 64)  # heads * head_dim beyond the kernel's limit


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

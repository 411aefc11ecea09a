"""Re-rotating stored K by a position delta (document KV placed at a new position): K computed at
p and rotated by delta equals K computed at p + delta (fp32 tolerance); rotating by a then b equals
rotating by a + b; the C kernel and the torch backend agree with the reference and store V as is."""

import pytest
import torch

from kernels.attention_inputs import slot_ids_of
from kernels.rotary import RotaryEmbedding, rerotate_k, rerotation_cos_sin
from model.backends.torch_backend import TorchBackend

KV_HEADS, HEAD_DIM, MAX_POSITIONS = 3, 64, 2048
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}
ROPES = {"smollm2": (100000.0, None), "llama3": (500000.0, LLAMA3), "linear": (10000.0, {"type": "linear", "factor": 2.0})}


def _rotary(name: str, rotary_dim: int = HEAD_DIM) -> RotaryEmbedding:
    theta, scaling = ROPES[name]
    return RotaryEmbedding(HEAD_DIM, MAX_POSITIONS, theta, scaling, device="cpu", rotary_dim=rotary_dim)


def _k_at(rotary: RotaryEmbedding, raw_k: torch.Tensor, start: int) -> torch.Tensor:
    """raw_k (T, KVH, D) rotated as the model rotates it for positions start..start+T-1."""
    cos, sin = rotary.cos_sin(torch.arange(start, start + raw_k.shape[0]), raw_k.dtype)
    return RotaryEmbedding.apply(raw_k, cos, sin)


@pytest.mark.parametrize("name", ROPES)
@pytest.mark.parametrize("start, delta", [(0, 37), (5, 600), (900, -850), (64, 0), (1000, 1000)])
def test_rerotated_k_equals_k_computed_at_the_new_position(name, start, delta):
    rotary = _rotary(name)
    raw_k = torch.randn(40, KV_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(start))
    moved = rerotate_k(_k_at(rotary, raw_k, start), delta, rotary.inv_freq)
    # float32 angles of positions up to 2k carry ~1e-4 rad of rounding on either side
    torch.testing.assert_close(moved, _k_at(rotary, raw_k, start + delta), atol=5e-4, rtol=1e-4)


@pytest.mark.parametrize("a, b", [(10, 25), (300, -120), (-7, 7)])
def test_rotating_by_a_then_b_equals_by_a_plus_b(a, b):
    rotary = _rotary("llama3")
    k = torch.randn(16, KV_HEADS, HEAD_DIM)
    twice = rerotate_k(rerotate_k(k, a, rotary.inv_freq), b, rotary.inv_freq)
    torch.testing.assert_close(twice, rerotate_k(k, a + b, rotary.inv_freq), atol=1e-5, rtol=1e-5)
    if a + b == 0:
        torch.testing.assert_close(twice, k, atol=1e-5, rtol=1e-5)


def _stores(store, delta: int, rotary_dim: int = HEAD_DIM):
    """(k_cache, v_cache, k, v, slots) after `store` wrote 20 rows of k, v into shuffled slots."""
    rotary = _rotary("smollm2", rotary_dim)
    gen = torch.Generator().manual_seed(3)
    k, v = torch.randn(20, KV_HEADS, HEAD_DIM, generator=gen), torch.randn(20, KV_HEADS, HEAD_DIM, generator=gen)
    k_before = k.clone()
    k_cache = torch.full((8, 16, KV_HEADS, HEAD_DIM), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    slots = torch.tensor(slot_ids_of([5, 2], 7, 27, 16))
    cos, sin = rerotation_cos_sin(rotary.inv_freq, delta)
    store(k, v, cos, sin, k_cache, v_cache, slots)
    assert torch.equal(k, k_before)  # the stored entry is never rotated in place
    flat_k, flat_v = k_cache.view(-1, KV_HEADS, HEAD_DIM), v_cache.view(-1, KV_HEADS, HEAD_DIM)
    return flat_k[slots], flat_v[slots], rerotate_k(k, delta, rotary.inv_freq), v


@pytest.mark.parametrize("delta", [0, 123, -40])
def test_torch_backend_stores_rotated_k_and_v_as_is(delta):
    got_k, got_v, want_k, want_v = _stores(TorchBackend(torch.device("cpu"), torch.float32).store_rerotated_kv, delta)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@pytest.mark.parametrize("delta", [0, 123, -40])
@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, 48])  # 48: partial rotary dimensions (Phi-3/4)
def test_c_kernel_equals_the_reference(ops, num_threads, delta, rotary_dim):
    got_k, got_v, want_k, want_v = _stores(ops.rerotate_store_kv, delta, rotary_dim)
    torch.testing.assert_close(got_k, want_k, atol=1e-6, rtol=1e-6)
    assert torch.equal(got_v, want_v)


def test_c_kernel_refuses_bad_slots_and_writes_nothing(ops):
    k = torch.randn(4, KV_HEADS, HEAD_DIM)
    cos, sin = rerotation_cos_sin(_rotary("smollm2").inv_freq, 5)
    k_cache = torch.zeros(2, 16, KV_HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    with pytest.raises(ValueError, match="slot_ids"):
        ops.rerotate_store_kv(k, k, cos, sin, k_cache, v_cache, torch.tensor([0, 1, 2, 32]))
    assert not k_cache.any() and not v_cache.any()


@pytest.mark.parametrize("delta", [0, 123, -40])
def test_torch_backend_rerotates_float8_k_by_dequantize_rotate_quantize(delta):
    """Document KV placed from float8 pages (engine/document_kv_copy.py): K dequantized, rotated, quantized
    again; V dequantized and quantized again gives back the very same float8 bytes and scales."""
    from kernels.kv_format import KVPages, quantize

    rotary = _rotary("smollm2")
    gen = torch.Generator().manual_seed(4)
    k, v = torch.randn(20, KV_HEADS, HEAD_DIM, generator=gen), torch.randn(20, KV_HEADS, HEAD_DIM, generator=gen)
    source_k, source_v = (KVPages.zeros("float8", (8, 16, KV_HEADS, HEAD_DIM), "cpu") for _ in range(2))
    source_slots = torch.arange(20)
    source_k.store(source_slots, k)
    source_v.store(source_slots, v)
    stored_k, stored_v = source_k.take_rows(source_slots), source_v.take_rows(source_slots)
    k_cache, v_cache = (KVPages.zeros("float8", (8, 16, KV_HEADS, HEAD_DIM), "cpu") for _ in range(2))
    slots = torch.tensor(slot_ids_of([5, 2], 7, 27, 16))
    cos, sin = rerotation_cos_sin(rotary.inv_freq, delta)
    TorchBackend(torch.device("cpu"), torch.float32).store_rerotated_kv(
        stored_k.dequantized(torch.float32), stored_v.dequantized(torch.float32), cos, sin, k_cache, v_cache, slots)
    placed_v = v_cache.take_rows(slots)
    assert torch.equal(placed_v.values.view(torch.uint8), stored_v.values.view(torch.uint8))
    torch.testing.assert_close(placed_v.scales, stored_v.scales, atol=0, rtol=1e-6)
    want_q, want_scale = quantize("float8", rerotate_k(stored_k.dequantized(torch.float32), delta, rotary.inv_freq))
    placed_k = k_cache.take_rows(slots)
    assert torch.equal(placed_k.values.view(torch.uint8), want_q.view(torch.uint8))
    torch.testing.assert_close(placed_k.scales, want_scale, atol=0, rtol=0)
    # one more rounding than K computed at the new position: within e4m3's step of it
    torch.testing.assert_close(placed_k.dequantized(torch.float32), rerotate_k(k, delta, rotary.inv_freq),
                               atol=0.25, rtol=0.07)

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from kernels.rotary import LAZY_TABLE_POSITIONS, RotaryEmbedding, rope_inv_freq

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 6, 2, 32
MAX_POSITIONS = 4096

SCALINGS = {
    "none": None,
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
}


def _hf_rotary(theta: float, scaling: dict | None) -> LlamaRotaryEmbedding:
    config = LlamaConfig(
        hidden_size=NUM_HEADS * HEAD_DIM,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=theta,
        rope_scaling=dict(scaling) if scaling else None,
    )
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("name", SCALINGS)
def test_inv_freq_matches_hf(name):
    theta = 500000.0 if name == "llama3" else 10000.0
    hf = _hf_rotary(theta, SCALINGS[name])
    ours = rope_inv_freq(HEAD_DIM, theta, SCALINGS[name])
    assert ours.dtype == torch.float32 and ours.shape == (HEAD_DIM // 2,)
    torch.testing.assert_close(ours, hf.inv_freq, atol=0, rtol=1e-6)


def test_llama3_scaling_changes_only_low_frequencies():
    plain = rope_inv_freq(HEAD_DIM, 500000.0, None)
    scaled = rope_inv_freq(HEAD_DIM, 500000.0, SCALINGS["llama3"])
    assert scaled[0] == plain[0]  # highest frequency kept
    torch.testing.assert_close(scaled[-1], plain[-1] / 8.0)  # lowest slowed by factor


def test_type_is_an_alias_of_rope_type():
    legacy = {"type": "linear", "factor": 4.0}
    torch.testing.assert_close(rope_inv_freq(HEAD_DIM, 10000.0, legacy), rope_inv_freq(HEAD_DIM, 10000.0, SCALINGS["linear"]))


def test_unknown_rope_type_is_named():
    with pytest.raises(ValueError, match="yarn"):
        rope_inv_freq(HEAD_DIM, 10000.0, {"rope_type": "yarn", "factor": 4.0})


def _random_qkp(dtype, num_tokens=37):
    torch.manual_seed(0)
    q = torch.randn(num_tokens, NUM_HEADS, HEAD_DIM).to(dtype)
    k = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM).to(dtype)
    positions = torch.cat([torch.arange(5), torch.randint(0, MAX_POSITIONS, (num_tokens - 5,))])
    return q, k, positions


def _hf_apply(hf: LlamaRotaryEmbedding, q, k, positions):
    cos, sin = hf(q, positions[None])  # (1, N, D) each, in q.dtype
    q_rot, k_rot = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    return q_rot[0].transpose(0, 1), k_rot[0].transpose(0, 1)  # back to (N, heads, D)


@pytest.mark.parametrize("name", SCALINGS)
def test_rotation_matches_hf_in_float32(name):
    theta = 500000.0 if name == "llama3" else 10000.0
    rotary = RotaryEmbedding(HEAD_DIM, MAX_POSITIONS, theta, SCALINGS[name], device="cpu")
    q, k, positions = _random_qkp(torch.float32)
    q_rot, k_rot = rotary(q, k, positions)
    q_hf, k_hf = _hf_apply(_hf_rotary(theta, SCALINGS[name]), q, k, positions)
    assert q_rot.shape == q.shape and k_rot.shape == k.shape
    torch.testing.assert_close(q_rot, q_hf, atol=1e-5, rtol=0)
    torch.testing.assert_close(k_rot, k_hf, atol=1e-5, rtol=0)


@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
def test_rotation_matches_hf_in_bfloat16(table_dtype):
    scaling = SCALINGS["llama3"]
    rotary = RotaryEmbedding(HEAD_DIM, MAX_POSITIONS, 500000.0, scaling, device="cpu", dtype=table_dtype)
    q, k, positions = _random_qkp(torch.bfloat16)
    q_rot, k_rot = rotary(q, k, positions)
    q_hf, k_hf = _hf_apply(_hf_rotary(500000.0, scaling), q, k, positions)
    assert q_rot.dtype == k_rot.dtype == torch.bfloat16
    # same float32 tables, same cast, same bf16 arithmetic in the same order: bit-identical
    assert torch.equal(q_rot, q_hf) and torch.equal(k_rot, k_hf)


def test_position_zero_is_identity():
    rotary = RotaryEmbedding(HEAD_DIM, 16, 10000.0, None, device="cpu")
    q, k, _ = _random_qkp(torch.float32, num_tokens=6)
    q_rot, k_rot = rotary(q, k, torch.zeros(6, dtype=torch.int64))
    assert torch.equal(q_rot, q) and torch.equal(k_rot, k)


def test_freq_factors_divide_each_frequency():
    """The GGUF importer's contract for a Llama-3 file's rope_freqs: inv_freq / factors, as llama.cpp applies it."""
    factors = [1.0 + i for i in range(HEAD_DIM // 2)]
    scaled = rope_inv_freq(HEAD_DIM, 500000.0, {"rope_type": "freq_factors", "factors": factors})
    torch.testing.assert_close(scaled, rope_inv_freq(HEAD_DIM, 500000.0, None) / torch.tensor(factors))
    with pytest.raises(ValueError, match="16 numbers"):
        rope_inv_freq(HEAD_DIM, 500000.0, {"rope_type": "freq_factors", "factors": factors[:3]})


def test_longrope_and_partial_rotary_match_hf():
    from transformers import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as phi3_apply

    rotary_dim, original = HEAD_DIM // 2, 64
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "short_factor": [1.0 + 0.05 * i for i in range(rotary_dim // 2)],
            "long_factor": [1.0 + 0.5 * i for i in range(rotary_dim // 2)],
            "original_max_position_embeddings": original}
    config = Phi3Config(hidden_size=NUM_HEADS * HEAD_DIM, num_attention_heads=NUM_HEADS, num_key_value_heads=NUM_KV_HEADS,
                        max_position_embeddings=4 * original, original_max_position_embeddings=original,
                        rope_parameters=dict(rope), pad_token_id=0)
    assert config.rope_parameters["original_max_position_embeddings"] == original
    hf = Phi3RotaryEmbedding(config)
    scaling = {**rope, "factor": 4.0}
    g = torch.Generator().manual_seed(3)
    for length, long_context in ((original, False), (original + 9, True)):
        ours = RotaryEmbedding(HEAD_DIM, 4 * original, 10000.0, scaling, device="cpu", rotary_dim=rotary_dim,
                               long_context=long_context)
        q = torch.randn(length, NUM_HEADS, HEAD_DIM, generator=g)
        k = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=g)
        positions = torch.arange(length)
        cos, sin = hf(q, positions[None])
        hf_q, hf_k = phi3_apply(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
        our_q, our_k = ours(q, k, positions)
        torch.testing.assert_close(our_q, hf_q[0].transpose(0, 1), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(our_k, hf_k[0].transpose(0, 1), atol=1e-6, rtol=1e-5)


def test_cpu_tables_grow_on_demand_to_the_same_values():
    """A CPU model's tables start small and double when a later position needs them; every row is the
    value the whole table gives it."""
    lazy = RotaryEmbedding(64, 131072, 500000.0, None, "cpu")
    assert lazy.cos.shape[0] == LAZY_TABLE_POSITIONS
    whole = RotaryEmbedding(64, 131072, 500000.0, None, "cpu")
    whole._build(131072)
    positions = torch.tensor([0, 4095, 4096, 70000, 131071])
    cos, sin = lazy.cos_sin(positions, torch.float32)
    assert lazy.cos.shape[0] == 131072
    assert torch.equal(cos[:, 0], whole.cos[positions]) and torch.equal(sin[:, 0], whole.sin[positions])

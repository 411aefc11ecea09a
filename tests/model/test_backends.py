"""Each execution backend against the torch reference, op by op; what runs is read from its plan."""

import pytest
import torch

from kernels.activation import silu_and_mul
from kernels.attention_inputs import AttentionInputs, slot_ids_of
from kernels.paged_attention import paged_attention_reference, store_kv
from kernels.rms_norm import rms_norm
from kernels.rotary import RotaryEmbedding
from model.backends import BACKEND_CHOICES, select_backend
from model.backends.crossover import CANDIDATE_ROWS
from model.config import ModelConfig
from model.linear import Linear
from store.model_store import radixserve_home

CONFIG = ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=64, intermediate_size=128,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                     rope_scaling=None, max_position_embeddings=512, tie_word_embeddings=True, has_qkv_bias=False)


@pytest.fixture(scope="module")
def build_dir():
    # the suite's shared build cache: kernels are keyed by source hash and variant, so a library another
    # test built already is loaded, not compiled again (each build is tens of seconds on 2 cores)
    return radixserve_home() / "kernels"


def _backend(name, build_dir, dtype=torch.float32, crossover="fixed"):
    return select_backend("cpu", dtype, CONFIG, name, build_dir=build_dir, crossover=crossover)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_ops_match_the_reference(backend, build_dir):
    ops = _backend(backend, build_dir)
    g = _gen(0)
    x, residual = (torch.randn(5, 64, generator=g) for _ in range(2))
    weight = torch.randn(64, generator=g)
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5))
    normed, stream = ops.add_rms_norm(residual.clone(), x, weight, 1e-5)
    torch.testing.assert_close(stream, residual + x)
    torch.testing.assert_close(normed, rms_norm(residual + x, weight, 1e-5))
    gate_up = torch.randn(5, 256, generator=g)
    torch.testing.assert_close(ops.silu_and_mul(gate_up), silu_and_mul(gate_up))


def test_rope_store_kv_and_attention_match_the_reference(backend, build_dir):
    ops = _backend(backend, build_dir)
    g = _gen(1)
    page_size, num_heads, num_kv_heads, head_dim = 4, 4, 2, 16
    k_cache, v_cache = torch.zeros(2, 8, page_size, num_kv_heads, head_dim)
    chunks = [([5, 2, 7], 0, 9), ([1, 3], 5, 6), ([0, 6], 7, 8)]  # a prefill and two decodes (prefixes cached)
    for page_ids, start, _ in chunks:  # the cached prefixes
        slots = torch.tensor(slot_ids_of(page_ids, 0, start, page_size), dtype=torch.int64)
        store_kv(k_cache, v_cache, *(torch.randn(start, num_kv_heads, head_dim, generator=g) for _ in range(2)), slots)
    attn = AttentionInputs.for_chunks(chunks, page_size, "cpu")
    rotary = RotaryEmbedding(head_dim, 64, 10000.0, None, device=torch.device("cpu"))
    cos, sin = rotary.cos_sin(attn.positions, torch.float32)
    qkv = torch.randn(attn.num_tokens, num_heads + 2 * num_kv_heads, head_dim, generator=g)
    expected_qk = RotaryEmbedding.apply(qkv[:, : num_heads + num_kv_heads], cos, sin)
    expected_k_cache, expected_v_cache = k_cache.clone(), v_cache.clone()
    store_kv(expected_k_cache, expected_v_cache, expected_qk[:, num_heads:], qkv[:, num_heads + num_kv_heads:],
             attn.slot_ids)
    q = ops.rope_store_kv(qkv.clone(), cos, sin, k_cache, v_cache, attn.slot_ids, num_heads)
    torch.testing.assert_close(q, expected_qk[:, :num_heads])
    torch.testing.assert_close(k_cache, expected_k_cache)
    torch.testing.assert_close(v_cache, expected_v_cache)
    scale = head_dim**-0.5
    torch.testing.assert_close(ops.attention(q, k_cache, v_cache, attn, scale),
                               paged_attention_reference(q, k_cache, v_cache, attn, scale), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, 9, 40])
def test_linear_layers_match_the_reference(backend, build_dir, rows):
    ops = _backend(backend, build_dir)
    g = _gen(rows)
    layer = Linear(64, 96, bias=True)
    layer.weight.data.copy_(torch.randn(96, 64, generator=g))
    layer.bias.data.copy_(torch.randn(96, generator=g))
    x = torch.randn(rows, 64, generator=g)
    expected = layer(x)
    torch.testing.assert_close(ops.make_linear("layers.0.mlp.x", layer, None)(x), expected, atol=1e-4, rtol=1e-4)


def test_auto_takes_cpu_for_float32_and_torch_elsewhere(build_dir):
    cpu = _backend("auto", build_dir)
    assert cpu.name == "cpu" and cpu.policy.max_num_batched_tokens == 512
    bf16 = _backend("auto", build_dir, dtype=torch.bfloat16)
    assert bf16.name == "torch"
    assert "cpu not chosen (runs float32, not bfloat16)" in bf16.describe()
    with pytest.raises(ValueError, match="backend cpu runs float32"):
        _backend("cpu", build_dir, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="backend must be one of"):
        _backend("tpu", build_dir)
    assert set(BACKEND_CHOICES) == {"auto", "torch", "cpu"}


def test_the_plan_says_what_runs(backend, build_dir, request):
    ops = _backend(backend, build_dir)
    layer = Linear(64, 96, bias=False)
    layer.weight.data.normal_()
    ops.make_linear("layers.0.mlp.down_proj", layer, None)
    plan = ops.plan()
    no_compiler = request.node.callspec.params["backend"] == "cpu-no-compiler"
    if backend == "torch":
        assert (plan.row_ops, str(plan.linears["layers.0.mlp.down_proj"])) == ("torch ops", "torch F.linear")
        assert not ops.policy.attention.fused_decode
    elif no_compiler:  # what a machine without a C compiler gets: oneDNN GEMMs, torch ops, reasons said
        assert plan.row_ops == "torch ops" and not ops.policy.attention.fused_decode
        assert str(plan.linears["layers.0.mlp.down_proj"]) == "oneDNN prepacked"
        assert any("no C compiler" in line for line in plan.fallbacks) and "no C compiler" in ops.describe()
        assert plan.prefill_attention == "SDPA over gathered K/V" and not ops.policy.attention.fused_prefill
        assert any(line.startswith("C prefill attention off") for line in plan.fallbacks)
    else:
        assert plan.row_ops == "fused C kernels" and ops.policy.attention.fused_decode
        assert ops.policy.attention.fused_prefill
        assert plan.prefill_attention == f"C kernel over pages ({ops.prefill_attention.instruction_set})"
        assert f"prefill attention: {plan.prefill_attention}" in ops.describe()
        assert plan.linears["layers.0.mlp.down_proj"].few_rows_max == 1  # the float32 matvec: one row
        # nothing falls back but what this CPU's instruction sets leave out (an AVX2 machine: the AVX-512 builds, bf16)
        assert all("this CPU lacks" in line for line in plan.fallbacks), plan.fallbacks


def test_prefill_attention_on_sdpa_when_asked(build_dir):
    ops = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, crossover="fixed",
                         prefill_attention="sdpa")
    assert ops.prefill_attention is None and not ops.policy.attention.fused_prefill
    assert "prefill attention: SDPA over gathered K/V" in ops.describe()
    assert "C prefill attention off (sdpa asked for)" in ops.describe()
    with pytest.raises(ValueError, match="prefill_attention must be one of"):
        select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, prefill_attention="flash")


def test_heads_outside_the_prefill_kernels_limits_get_sdpa_in_every_build(build_dir):
    """A head_dim the C prefill kernel cannot take (not a multiple of 8): SDPA, and no AMX build either."""
    import dataclasses

    config = dataclasses.replace(CONFIG, head_dim=12)
    for prefill_dtype in ("float32", "auto"):
        ops = select_backend("cpu", torch.float32, config, "cpu", build_dir=build_dir, prefill_dtype=prefill_dtype)
        assert ops.prefill_attention is None and ops.bf16_prefill_attention is None
        assert "C prefill attention off (the model's heads are outside its limits)" in ops.describe()


def test_measured_limits_are_candidates_and_reported(build_dir):
    ops = _backend("cpu", build_dir, crossover="measure")
    if ops.matvec is None:
        pytest.skip("no C kernels here")
    layer = Linear(64, 96, bias=False)
    layer.weight.data.normal_()
    ops.make_linear("layers.0.mlp.down_proj", layer, None)
    limit = ops.plan().linears["layers.0.mlp.down_proj"].few_rows_max
    assert limit in (0, *[m for m in CANDIDATE_ROWS if m <= 1])
    assert "measured few-rows limits float32 row-major (96x64)" in ops.describe()

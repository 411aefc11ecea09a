"""The cpu backend over GGUF blocks: the kernel variant named, int8 activations, prefill's dtype and the GEMMs over
blocks that serve it (oneDNN tiles, AMX, FMA), bf16 products by kind of row, the kept outputs, and a part held only
as its decode copy."""

import pytest
import torch

from model.backends import select_backend
from model.linear import Linear
from tests.model.test_backends import CONFIG, _gen, build_dir  # noqa: F401 (build_dir: the module's fixture)


def _blocks_layer(block_format, rows, cols, seed):
    """A Linear whose weight is the dequantization of gguf blocks, and those blocks."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    from kernels.block_formats import BlockWeight

    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    blocks = quantize(values, GGMLQuantizationType[block_format])
    layer = Linear(cols, rows, bias=False)
    layer.weight.data.copy_(torch.from_numpy(dequantize(blocks, GGMLQuantizationType[block_format])))
    return layer, BlockWeight.from_gguf(block_format, blocks, cols)


@pytest.mark.parametrize("variant", ["auto", "avx2", "portable"])
def test_each_kernel_variant_runs_here_and_is_named(build_dir, variant):
    """What an AVX2-only machine (and one without our kernels) gets, forced on this one."""
    from kernels.cpu_features import this_cpu

    if variant != "portable" and not this_cpu().has("avx2", "fma", "f16c"):
        pytest.skip("this CPU lacks AVX2/FMA/F16C")
    ops = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, crossover="fixed",
                         cpu_kernels=variant, int8_activations=True)
    layer, blocks = _blocks_layer("Q8_0", 96, 64, seed=7)
    linear = ops.make_linear("layers.0.mlp.down_proj", layer, [blocks] if ops.reads_blocks else None)
    x = torch.randn(40, 64, generator=_gen(2))
    expected = x.double() @ layer.weight.double().t()
    # int8 activations: x's rounding (<= 1/254 of a block's max|x| an element) over 64 unit-scale products
    # (tests/kernels/test_cpu_gemm_q8.py holds the kernel to its exact bound)
    torch.testing.assert_close(linear(x).double(), expected, atol=0.3, rtol=0)
    chosen = ops.gemm_q8.variant if ops.gemm_q8 is not None else "portable"
    plan, text = ops.plan(), ops.describe()
    assert f"kernels: {this_cpu().best_variant() if variant == 'auto' else variant}" in text
    assert this_cpu().describe() in text
    if variant == "portable":  # the plain-C block kernels and torch's ops
        assert plan.row_ops == "torch ops" and ops.gemm_q8 is None
        assert plan.linears["layers.0.mlp.down_proj"].large.startswith("torch GEMM over dequantized tiles")
        assert any("portable path was asked for" in line for line in plan.fallbacks)
    else:
        assert plan.linears["layers.0.mlp.down_proj"].large == f"int8 GEMM over Q8_0 blocks ({chosen})"
        assert plan.row_ops == "fused C kernels"


def test_int8_activations_can_be_turned_off(build_dir):
    ops = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, crossover="fixed",
                         int8_activations=False)
    layer, blocks = _blocks_layer("Q4_1", 96, 64, seed=8)
    linear = ops.make_linear("layers.0.mlp.down_proj", layer, [blocks])
    x = torch.randn(40, 64, generator=_gen(3))
    torch.testing.assert_close(linear(x), layer(x), atol=1e-4, rtol=1e-4)
    large = ops.plan().linears["layers.0.mlp.down_proj"].large
    if ops.fma_gemm is not None:  # an AVX2 machine: float32 over the blocks with FMA
        assert large == "FMA GEMM over Q4_1 blocks (float32)"
    else:
        assert large.startswith("torch GEMM over dequantized tiles") or large.startswith("AMX GEMM")


def test_int8_activations_keep_the_named_projections_on_float_activations(build_dir):
    """float_activation_layers (the quality lever, bench/int8_activation_quality.py) by the name's last part."""
    from kernels.cpu_features import this_cpu
    from model.backends.cpu_backend import INT8_FLOAT_ACTIVATION_LAYERS, CpuBackend

    if not this_cpu().has("avx2", "fma", "f16c"):
        pytest.skip("this CPU lacks AVX2/FMA/F16C: no int8 kernels")
    assert INT8_FLOAT_ACTIVATION_LAYERS == ()  # the default: every projection over fitting blocks on int8
    chosen = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, crossover="fixed",
                            int8_activations=True)
    ops = CpuBackend(chosen.matvec, chosen.ops, gemm_q8=chosen.gemm_q8, crossover="fixed",
                     load_block_kernels=lambda: chosen.block_kernels, float_activation_layers=("lm_head",),
                     decode_activations="float32")  # its few rows through the float kernel: exact weights
    layer, blocks = _blocks_layer("Q8_0", 96, 64, seed=9)
    head = ops.make_linear("lm_head", layer, [blocks])
    ops.make_linear("layers.0.mlp.down_proj", layer, [blocks])
    x = torch.randn(3, 64, generator=_gen(4))
    torch.testing.assert_close(head(x), layer(x), atol=1e-4, rtol=1e-4)  # float activations: exact weights
    linears = ops.plan().linears
    assert not linears["lm_head"].large.startswith("int8")
    assert linears["layers.0.mlp.down_proj"].large.startswith("int8 GEMM")


def test_prefill_dtype_auto_keeps_float32_on_an_avx2_machine(build_dir, monkeypatch):
    """What a machine without native bf16 gets (forced on this one): float32 over the blocks with FMA, the
    fallback named."""
    import model.backends as backends_module
    from kernels.cpu_features import CpuFeatures

    avx2_only = CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c"}))
    monkeypatch.setattr(backends_module, "this_cpu", lambda: avx2_only)
    ops = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, prefill_dtype="auto")
    assert ops.prefill_dtype == "float32"
    assert "bfloat16 prefill off (this CPU lacks AVX512_BF16/AMX-BF16): float32 GEMMs" in ops.plan().fallbacks
    layer, blocks = _blocks_layer("Q4_1", 96, 64, seed=10)
    linear = ops.make_linear("layers.0.mlp.down_proj", layer, [blocks] if ops.reads_blocks else None)
    x = torch.randn(40, 64, generator=_gen(5))
    torch.testing.assert_close(linear(x), layer(x), atol=1e-4, rtol=1e-4)
    if ops.reads_blocks:
        assert ops.plan().linears["layers.0.mlp.down_proj"].large == "FMA GEMM over Q4_1 blocks (float32)"
        assert ops.float_prefill_max_bytes == 0  # no float32 copy of a small model's projections beside the blocks


def test_the_fma_gemm_only_where_the_kernels_are_the_avx2_build(build_dir):
    """float32 prefill over the blocks with FMA where the avx2 kernels are chosen (or asked for); on an AVX-512 machine
    oneDNN's 512-bit float32 GEMM keeps prefill (over tiles, or the AMX GEMM under bf16 products)."""
    from kernels.cpu_features import this_cpu

    if not this_cpu().has("avx2", "fma", "f16c"):
        pytest.skip("this CPU lacks AVX2/FMA/F16C")
    asked = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, cpu_kernels="avx2",
                           prefill_dtype="float32")
    assert asked.fma_gemm is not None
    layer, blocks = _blocks_layer("Q8_0", 32, 256, seed=11)
    linear = asked.make_linear("layers.0.mlp.down_proj", layer, [blocks])
    x = torch.randn(12, 256, generator=_gen(6))  # past the few-rows kernel's 8 rows, not grouped: the GEMM
    assert torch.equal(linear(x), asked.fma_gemm.matmul(x, blocks))
    plan = asked.plan().linears["layers.0.mlp.down_proj"]
    assert plan.large == "FMA GEMM over Q8_0 blocks (float32)" and plan.few_rows_max == 8
    best = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, prefill_dtype="float32")
    assert (best.fma_gemm is not None) == (this_cpu().best_variant() == "avx2")


def test_prefill_dtype_auto_takes_bf16_only_where_products_run_and_measured_faster(build_dir, monkeypatch):
    import model.backends as backends_module
    from kernels import bf16_products
    from kernels.cpu_features import CpuFeatures

    native = CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c", "avx512_bf16"}))
    monkeypatch.setattr(backends_module, "this_cpu", lambda: native)
    monkeypatch.setattr(backends_module.packed_linear, "bf16_is_available", lambda: True)
    monkeypatch.setattr(bf16_products, "run_here", lambda: True)
    for speedup, chosen in ((0.6, "float32"), (4.0, "bfloat16")):
        monkeypatch.setattr(backends_module, "bf16_gemm_speedup", lambda: speedup)
        ops = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, prefill_dtype="auto")
        assert ops.prefill_dtype == chosen
        slower = "bfloat16 prefill off (a bf16 GEMM ran 0.60x float32's here, under 1.25x): float32 GEMMs"
        assert (slower in ops.plan().fallbacks) == (chosen == "float32")
        assert ops.prefill_math.bf16_products == (chosen == "bfloat16")
        assert ops.policy.attention.prompts_as_prefill == (chosen == "bfloat16")
    # without bf16 products (no AMX) auto keeps float32 however fast bf16 tensors are, and says why
    monkeypatch.setattr(bf16_products, "run_here", lambda: False)
    ops = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, prefill_dtype="auto")
    assert ops.prefill_dtype == "float32" and any("no bf16 products" in f for f in ops.plan().fallbacks)


def _native_bf16_or_skip():
    from kernels.cpu_features import this_cpu
    from kernels.packed_linear import bf16_is_available

    if not (this_cpu().has_native_bf16() and bf16_is_available()):
        pytest.skip("this CPU (or torch's oneDNN) has no native bf16 GEMM")


def test_bf16_tensor_tiles_round_to_bf16_and_decode_rows_stay_float32(build_dir, monkeypatch):
    """Asked for where bf16 products do not run (forced here): GEMMs over bf16 tensors."""
    from kernels import bf16_products

    _native_bf16_or_skip()
    monkeypatch.setattr(bf16_products, "run_here", lambda: False)
    ops = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, prefill_dtype="bfloat16",
                         decode_activations="float32")  # decode rows through the float kernel
    assert ops.prefill_dtype == "bfloat16" and "prefill GEMMs: bfloat16 tensors" in ops.describe()
    layer, blocks = _blocks_layer("Q4_1", 96, 64, seed=11)
    linear = ops.make_linear("layers.0.mlp.down_proj", layer, [blocks])
    assert ops.plan().linears["layers.0.mlp.down_proj"].large == (
        "torch GEMM over dequantized tiles of Q4_1 blocks (bfloat16 tensors)")
    x = torch.randn(40, 64, generator=_gen(6))
    rounded = (x.bfloat16().double() @ layer.weight.bfloat16().double().t())  # bf16 inputs, exact sums
    prefill = linear(x)
    assert prefill.dtype == torch.float32 and not torch.equal(prefill, layer(x))
    # what is left: the output's rounding to bf16 (half a unit in the 8th bit) and summation order
    torch.testing.assert_close(prefill.double(), rounded, atol=1e-6, rtol=2 ** -8)
    torch.testing.assert_close(linear(x[:3]), layer(x[:3]), atol=1e-4, rtol=1e-4)  # decode rows: float32 kernels
    head = ops.make_linear("lm_head", layer, [blocks])  # the logits: float32 (cpu_backend.BF16_FLOAT_LAYERS)
    assert ops.plan().linears["lm_head"].large == "torch GEMM over dequantized tiles of Q4_1 blocks"
    torch.testing.assert_close(head(x), layer(x), atol=1e-4, rtol=1e-4)


def _refuse(*args, **kwargs):
    from kernels.native_build import NativeUnavailable

    raise NativeUnavailable("blocks_amx: off for this test")


def _step(query_lens: list[int], num_generated: list[int]):
    """The AttentionInputs of a step of sequences with these new tokens, the last num_generated of each generated."""
    from kernels.attention_inputs import AttentionInputs

    return AttentionInputs.build(list(range(sum(query_lens))), query_lens, query_lens, [[0]] * len(query_lens), "cpu",
                                 num_generated)


@pytest.mark.parametrize("gemm", ["AMX GEMM over Q4_1 blocks (bf16 products)",
                                  "torch GEMM over dequantized tiles of Q4_1 blocks (bfloat16 products)"])
def test_bf16_products_run_prompt_rows_on_the_gemm_and_generated_rows_as_float32(build_dir, monkeypatch, gemm):
    """Under bf16 products a step's prompt rows take the bf16 GEMM at any count (on AMX tiles over the blocks,
    or oneDNN's over dequantized tiles where that GEMM is off), its generated rows the float32 path by their own
    count (over tiles the few-rows kernel, in groups of 8, up to 32 rows); outside a step, by the row count."""
    from kernels import amx_gemm, bf16_products
    from kernels.native_build import NativeUnavailable

    _native_bf16_or_skip()
    if not bf16_products.run_here():
        pytest.skip("oneDNN runs no bf16 products in float32 GEMMs here (needs AMX)")
    if gemm.startswith("AMX"):
        try:
            amx_gemm.load(build_dir)
        except NativeUnavailable as error:
            pytest.skip(str(error))
    else:
        monkeypatch.setattr(amx_gemm, "load", _refuse)
    ops = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, prefill_dtype="bfloat16",
                         decode_activations="float32")
    assert "prefill GEMMs: bfloat16 products" in ops.describe()
    assert any(line.startswith("AMX GEMM over blocks off") for line in ops.plan().fallbacks) == gemm.startswith("torch")
    layer, blocks = _blocks_layer("Q4_1", 96, 64, seed=12)
    linear = ops.make_linear("layers.0.mlp.down_proj", layer, [blocks])
    assert ops.plan().linears["layers.0.mlp.down_proj"].large == gemm
    x = torch.randn(40, 64, generator=_gen(7))
    rounded = x.bfloat16().double() @ layer.weight.bfloat16().double().t()
    prefill = linear(x)
    torch.testing.assert_close(prefill.double(), rounded, atol=1e-5, rtol=1e-5)  # float32 output: no bf16 rounding
    # a prompt row's bits do not depend on the row count
    for first, count in ((0, 1), (5, 17), (23, 17)):
        with ops.step(_step([count], [0])):
            assert torch.equal(linear(x[first:first + count]), prefill[first:first + count])
    float_rows = linear(x[:12])  # up to 32 rows outside a step: the float32 kernel, in groups of 8
    torch.testing.assert_close(float_rows, layer(x[:12]), atol=1e-4, rtol=1e-4)
    assert all(torch.equal(linear(x[row:row + 1]), float_rows[row:row + 1]) for row in (0, 7, 8, 11))
    with ops.step(_step([3], [0])):  # three prompt rows: the bf16 GEMM
        assert torch.equal(linear(x[:3]), prefill[:3])
    generated = torch.tensor([1, 38], dtype=torch.int64)
    with ops.step(_step([2, 37, 1], [1, 1, 0])):  # mixed: rows 1 and 38 on the float32 kernel, the rest bf16
        mixed = linear(x)
    assert torch.equal(mixed[generated], linear(x[generated]))
    keep = torch.ones(40, dtype=torch.bool)
    keep[generated] = False
    assert torch.equal(mixed[keep], prefill[keep])
    with ops.step(_step([1] * 40, [1] * 40)):  # every row generated: float32, by their count (the GEMM here)
        torch.testing.assert_close(linear(x), layer(x), atol=1e-4, rtol=1e-4)


def test_a_prompt_chunks_gated_activation_writes_a_kept_buffer(build_dir):
    """In a step, a gated activation of many prompt rows writes into one kept buffer (no fresh mapping a layer:
    cpu_backend.KEPT_OUTPUT_MIN_ROWS); few rows, and calls outside a step, get fresh outputs; the values alike."""
    from kernels import bf16_products
    from model.backends.cpu_backend import KEPT_OUTPUT_MIN_ROWS

    _native_bf16_or_skip()
    if not bf16_products.run_here():
        pytest.skip("steps mark their rows under bf16 products only (needs AMX)")
    ops = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, prefill_dtype="bfloat16")
    rows = KEPT_OUTPUT_MIN_ROWS + 6
    gate_up = torch.randn(rows, 64, generator=_gen(3))
    fresh = ops.silu_and_mul(gate_up)
    with ops.step(_step([rows], [0])):
        first, second = ops.silu_and_mul(gate_up), ops.silu_and_mul(gate_up * 2)
        assert first.data_ptr() == second.data_ptr()  # the same buffer: the caller reads it before the next
        few = ops.silu_and_mul(gate_up[:8])
        assert few.data_ptr() != first.data_ptr()
    assert torch.equal(ops.silu_and_mul(gate_up * 2), second)
    assert torch.equal(few, fresh[:8])


def test_a_part_read_only_through_its_copy_releases_its_blocks(build_dir):
    """With int16 decode over a copy in interleaved rows and float32 prefill on the FMA GEMM from that copy, nothing
    reads a Q4_1 part's blocks: the backend holds it as a CopiedPart (its blocks freed with the loader's), the
    products unchanged, describe() saying so; a stray read of its blocks is an error, not freed memory."""
    from model.backends.decode_copies import CopiedPart

    ops = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, cpu_kernels="avx2",
                         prefill_dtype="float32")
    if ops.fma_gemm is None or ops.decode_copies.kernels is None:
        pytest.skip("no FMA GEMM or interleaved copies here (no AVX2/FMA/F16C, or no compiler)")
    layer, blocks = _blocks_layer("Q4_1", 96, 64, seed=12)
    head_layer, head_blocks = _blocks_layer("Q8_0", 96, 64, seed=13)
    model = torch.nn.Module()
    model.down_proj, model.lm_head = layer, head_layer
    ops.prepare(model, {"down_proj": [blocks], "lm_head": [head_blocks]})
    (part,) = model.down_proj.parts
    assert isinstance(part, CopiedPart) and (part.format, part.rows, part.cols) == ("Q4_1", 96, 64)
    assert model.lm_head.parts == [head_blocks]  # Q8_0: no copy, the blocks stay
    with pytest.raises(RuntimeError, match="blocks were released"):
        part.blocks
    x_decode, x_prefill = torch.randn(3, 64, generator=_gen(7)), torch.randn(40, 64, generator=_gen(8))
    copy = ops.decode_copies.copy_of(part)
    assert torch.equal(model.down_proj(x_prefill), ops.fma_gemm.matmul(x_prefill, blocks))
    assert torch.equal(model.down_proj(x_decode), ops.decode_copies.kernels.matmul_q16(x_decode, copy))
    notes = ops.plan().notes
    assert any("their blocks released" in note for note in notes)
    assert [note for note in notes if note.startswith("weights resident as blocks")] == ["weights resident as blocks: Q8_0 0 MiB"]


def test_layers_prefill_outputs_reuse_one_buffer_a_role_during_a_forward_only(build_dir):
    """Under bf16 products a layer projection's prefill GEMM writes into its role's buffer while a step runs (the
    next layer's call of that role overwrites it), and gives a fresh output outside one (its caller may hold
    it); the LM head's logits are always fresh."""
    from kernels import bf16_products

    _native_bf16_or_skip()
    if not bf16_products.run_here():
        pytest.skip("oneDNN runs no bf16 products in float32 GEMMs here (needs AMX)")
    ops = select_backend("cpu", torch.float32, CONFIG, "cpu", build_dir=build_dir, prefill_dtype="bfloat16")
    layer, blocks = _blocks_layer("Q4_1", 96, 64, seed=13)
    linears = {name: ops.make_linear(name, layer, [blocks]) for name in ("layers.0.mlp.down_proj",
                                                                          "layers.1.mlp.down_proj", "lm_head")}
    x = torch.randn(40, 64, generator=_gen(8))
    alone = linears["layers.0.mlp.down_proj"](x)
    assert linears["layers.0.mlp.down_proj"](x).data_ptr() != alone.data_ptr()  # fresh outside a step
    with ops.step(_step([40], [0])):
        first = linears["layers.0.mlp.down_proj"](x)
        assert torch.equal(first, alone)
        second = linears["layers.1.mlp.down_proj"](x)  # the next layer's down_proj: the same buffer
        assert second.data_ptr() == first.data_ptr() and torch.equal(second, alone)
        assert linears["lm_head"](x).data_ptr() != first.data_ptr()

"""The int8 GEMM over GGUF blocks, every variant this CPU runs, against float64 references.

Two references over the blocks' dequantized values (gguf's own dequantization):
- with x quantized as the kernel does (per block of 32, scale max|x| / 127, round half to
  even, in float32): only float32 summation separates the two, so the tolerance is tight;
- with x as given: the kernel may differ by the activations' rounding, at most half an x
  block's scale times the block's |w| summed, plus float32 summation; asserted as that bound.
"""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from kernels import cpu_gemm_q8
from kernels.cpu_features import VARIANTS, this_cpu
from kernels.block_formats import FORMATS, BlockWeight
from store.model_store import radixserve_home
from kernels.native_build import find_compiler
from tests.kernels.test_block_matmul import random_gguf_rows

RUNNABLE = [name for name, (needs, _) in VARIANTS.items() if this_cpu().has(*needs)]


@pytest.fixture(scope="module", params=list(VARIANTS))
def gemm(request):
    if request.param not in RUNNABLE or find_compiler() is None:
        pytest.skip(f"this machine cannot build or run the {request.param} variant")
    kernels = cpu_gemm_q8.load(radixserve_home() / "kernels", variant=request.param)
    assert kernels.variant == request.param
    return kernels


def _block_weight(block_format: str, rows: int, cols: int, seed: int) -> tuple[BlockWeight, np.ndarray]:
    """Blocks and their values (gguf's dequantization): gguf's quantization of normal values, or for
    the K-quants, which gguf cannot quantize, random bytes with small finite fp16 d and dmin."""
    rng = np.random.default_rng(seed)
    if block_format.endswith("_K"):
        blocks = random_gguf_rows(block_format, rows, cols, seed)
    else:
        blocks = quantize(rng.standard_normal((rows, cols)).astype(np.float32), GGMLQuantizationType[block_format])
    dequantized = dequantize(blocks, GGMLQuantizationType[block_format]).reshape(rows, cols).astype(np.float64)
    return BlockWeight.from_gguf(block_format, blocks, cols), dequantized


def _quantized_x(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (m, cols) float32 -> (its Q8 values times scales as float64, the scales (m, cols / 32))."""
    blocks = x.reshape(x.shape[0], -1, 32)
    scale = (np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inverse = np.where(scale != 0, np.float32(1) / np.where(scale != 0, scale, 1), 0).astype(np.float32)
    values = np.rint(blocks * inverse).astype(np.float64) * scale
    return values.reshape(x.shape).astype(np.float64), scale[..., 0]


@pytest.mark.parametrize("block_format", ["Q4_0", "Q4_1", "Q8_0", "Q4_K"])
@pytest.mark.parametrize("rows, cols", [(1, 256), (40, 768)])
@pytest.mark.parametrize("m", [1, 19])
def test_matches_float64_over_dequantized_weights(gemm, block_format, rows, cols, m):
    weight, values = _block_weight(block_format, rows, cols, seed=rows + cols)
    x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m)) * 3
    x[0, :32] = 0  # an all-zero block: scale 0
    got = gemm(x, gemm.repack(weight)).double().numpy()
    assert got.shape == (m, rows)
    x_values, x_scales = _quantized_x(x.numpy())
    same_x = x_values @ values.T
    np.testing.assert_allclose(got, same_x, rtol=1e-5, atol=1e-4)
    # against the true x: within half an x block's scale per element, over |w|
    abs_w = np.abs(values).reshape(rows, -1, 32).sum(axis=-1)  # (rows, blocks)
    bound = 0.5 * x_scales.astype(np.float64) @ abs_w.T + 1e-4 * (1 + np.abs(same_x))
    assert np.all(np.abs(got - x.double().numpy() @ values.T) <= bound)


@pytest.mark.parametrize("block_format", ["Q4_0", "Q4_1", "Q8_0", "Q4_K"])
def test_a_row_does_not_depend_on_the_rows_beside_it(gemm, block_format):
    weight, _ = _block_weight(block_format, 33, 256, seed=3)
    packed = gemm.repack(weight)
    x = torch.randn(21, 256, generator=torch.Generator().manual_seed(5))
    together = gemm(x, packed)
    for i in (0, 8, 20):
        assert torch.equal(gemm(x[i : i + 1], packed), together[i : i + 1])


def test_refuses_what_it_cannot_run(gemm):
    weight, _ = _block_weight("Q8_0", 4, 64, seed=1)
    packed = gemm.repack(weight)
    with pytest.raises(ValueError, match="wants x"):
        gemm(torch.randn(2, 32), packed)
    with pytest.raises(ValueError, match="wants x"):
        gemm(torch.randn(2, 64, dtype=torch.float64), packed)
    q6, _ = _block_weight("Q6_K", 4, 256, seed=2)
    assert not gemm.fits(q6)
    if "Q6_K" in gemm.q16_formats:  # the AVX2 build repacks it for matmul_q16 alone
        with pytest.raises(ValueError, match="gemm_q8 reads"):
            gemm(torch.randn(2, 256), gemm.repack(q6))
    else:
        with pytest.raises(ValueError, match="gemm_q8 reads"):
            gemm.repack(q6)
    q5, _ = _block_weight("Q5_K", 4, 256, seed=3)
    with pytest.raises(ValueError, match="gemm_q8 reads"):
        gemm.repack(q5)


@pytest.mark.parametrize("block_format", cpu_gemm_q8.Q16_AVX2_FORMATS)
@pytest.mark.parametrize("rows, cols", [(37, 256), (40, 768)])
def test_int16_activations_are_within_their_bound(gemm, block_format, rows, cols):
    """matmul_q16 over the repacked blocks: the weights exact, each x value off by at most max|x over its
    group of 32| / 65534 (the few-rows block kernels' bound: the same quantization); 37 rows end in a
    partial group; 11 rows are a call of 8 and one of 3, and a row's bits do not depend on them."""
    if block_format not in gemm.q16_formats:
        pytest.skip(f"the {gemm.variant} build multiplies {block_format} over its blocks only")
    weight, dense = _block_weight(block_format, rows, cols, seed=rows)
    packed = gemm.repack(weight)
    x = torch.randn(11, cols, generator=torch.Generator().manual_seed(cols))
    x[2, 40] = 30.0  # an outlier: its group's other values get coarser steps
    got = gemm.matmul_q16(x, packed)
    group_max = x.abs().reshape(11, -1, 32).amax(-1, keepdim=True).expand(-1, -1, 32).reshape(11, cols).double()
    bound = (group_max / 65534) @ torch.from_numpy(np.abs(dense)).T
    error = (got.double() - x.double() @ torch.from_numpy(dense).T).abs()
    assert (error <= bound * 1.001 + 1e-5).all()
    for m in (1, 3, 8):
        assert torch.equal(gemm.matmul_q16(x[:m], packed), got[:m])
    wider = torch.zeros(11, rows + 5)
    gemm.matmul_q16(x, packed, out=wider[:, 2:2 + rows])  # the columns of a wider output
    assert torch.equal(wider[:, 2:2 + rows], got) and not wider[:, :2].any() and not wider[:, 2 + rows:].any()


def test_int16_activations_are_the_same_bits_in_every_build():
    """Each build runs its own group height (16 rows, 8) and integer products (vpdpbusd, maddubs pairs), but
    the same float operations per row and block: the same bits."""
    builds = [cpu_gemm_q8.load(radixserve_home() / "kernels", variant=name) for name in RUNNABLE]
    if len(builds) < 2 or find_compiler() is None:
        pytest.skip("one build runs here: nothing to compare")
    for block_format in cpu_gemm_q8.Q16_FORMATS:
        weight, _ = _block_weight(block_format, 40, 768, seed=5)
        x = torch.randn(9, 768, generator=torch.Generator().manual_seed(6))
        results = [kernels.matmul_q16(x, kernels.repack(weight)) for kernels in builds]
        for other in results[1:]:
            assert torch.equal(other, results[0]), block_format


def test_int16_activations_refuse_what_they_cannot_run(gemm):
    weight, _ = _block_weight("Q8_0", 16, 256, seed=7)
    with pytest.raises(ValueError):
        gemm.matmul_q16(torch.zeros(1, 256), gemm.repack(weight))  # not a scale-and-min layout
    weight, _ = _block_weight("Q4_1", 16, 256, seed=7)
    with pytest.raises(ValueError):
        gemm.matmul_q16(torch.zeros(1, 255), gemm.repack(weight))
    with pytest.raises(ValueError):
        gemm.matmul_q16(torch.zeros(2, 256), gemm.repack(weight), out=torch.zeros(2, 15))


def test_q4_k_keeps_its_own_scales_in_about_its_own_bytes(gemm):
    """Q4_K repacks into 152 bytes a row's 256 weights (its 144, and d and -dmin as floats), not 192 (a float
    scale and min per 32): the bytes a decode reads (kernels/csrc/interleaved_rows.h)."""
    weight, _ = _block_weight("Q4_K", gemm.interleave * 3, 512, seed=9)
    assert gemm.repack(weight).packed.numel() == weight.blocks.numel() * 152 // 144


def test_q6_k_keeps_its_six_bits_in_about_its_own_bytes(gemm):
    """The AVX2 build repacks Q6_K into 212 bytes a row's 256 weights (its 210 with d as a float): 4-bit values and a
    plane of top bits, not a byte a weight (kernels/csrc/interleaved_rows.h)."""
    if "Q6_K" not in gemm.q16_formats:
        pytest.skip(f"the {gemm.variant} build multiplies Q6_K over its blocks only")
    weight, dense = _block_weight("Q6_K", gemm.interleave * 3, 512, seed=9)
    packed = gemm.repack(weight)
    assert packed.packed.numel() == weight.blocks.numel() * 212 // 210
    # x one-hot at columns across the 16-column scales, the nibbles and the planes: each output is one weight (times
    # 32767 and x's scale 1 / 32767: a rounding off)
    for column in (0, 15, 16, 31, 100, 255, 256, 511):
        x = torch.zeros(1, 512)
        x[0, column] = 1.0
        torch.testing.assert_close(gemm.matmul_q16(x, packed)[0], torch.from_numpy(dense[:, column]).float(),
                                   rtol=1e-6, atol=0)

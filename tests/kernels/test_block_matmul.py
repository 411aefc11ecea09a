"""The block-format kernels (kernels/block_matmul.py) against gguf's own `dequantize` and a float64
product, for every format of the table, in every build this machine runs (AVX-512 VNNI, AVX2, portable)."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from kernels import block_matmul
from kernels.block_formats import FORMATS, BlockWeight, dequantize_reference
from kernels.native_build import NativeUnavailable
from store.model_store import radixserve_home

# Byte offsets of each format's fp16 scales in GGUF's block struct: random bytes make valid blocks
# once these hold small finite halves.
FP16_SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
                      "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


BUILDS = ["avx512_vnni", "avx2", "portable"]


def _load(build: str):
    return block_matmul.load(radixserve_home() / "kernels", variant=build)


@pytest.fixture(scope="module", params=BUILDS)
def kernels(request):
    try:
        return _load(request.param)
    except NativeUnavailable as error:
        pytest.skip(str(error))


def random_gguf_rows(format_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """(rows, bytes) uint8 GGUF blocks of `format_name`: random bits, finite scales."""
    rng = np.random.default_rng(seed)
    spec = FORMATS[format_name]
    if format_name in ("F16", "BF16", "F32"):
        values = rng.standard_normal((rows, cols), dtype=np.float32)
        if format_name == "F32":
            return values.view(np.uint8)
        return quantize(values, GGMLQuantizationType[format_name]).view(np.uint8).reshape(rows, -1)
    blocks = rng.integers(0, 256, (rows, cols // spec.block_size, spec.gguf_bytes), dtype=np.uint8)
    for offset in FP16_SCALE_OFFSETS[format_name]:
        scales = (rng.uniform(0.001, 0.05, blocks.shape[:2]) * rng.choice([-1, 1], blocks.shape[:2])).astype(np.float16)
        blocks[:, :, offset:offset + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_dequantized_rows_equal_gguf_dequantize(kernels, format_name):
    rows, cols = 6, 512
    gguf_rows = random_gguf_rows(format_name, rows, cols, seed=1)
    weight = BlockWeight.from_gguf(format_name, gguf_rows, cols)
    expected = dequantize(gguf_rows, GGMLQuantizationType[format_name]).reshape(rows, cols).astype(np.float32)
    assert np.array_equal(dequantize_reference(weight).numpy(), expected)
    assert np.array_equal(kernels.dequantize_rows(weight).numpy(), expected)  # bit for bit
    looked_up = kernels.dequantize_rows(weight, row_ids=torch.tensor([[4, 0], [4, 5]]))
    assert looked_up.shape == (2, 2, cols)
    assert np.array_equal(looked_up.numpy(), expected[[[4, 0], [4, 5]]])
    assert np.array_equal(kernels.dequantize_rows(weight, first=2, count=3).numpy(), expected[2:5])


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_bfloat16_rows_are_the_float32_rows_rounded_as_torch_rounds(kernels, format_name):
    rows, cols = 5, 512
    weight = BlockWeight.from_gguf(format_name, random_gguf_rows(format_name, rows, cols, seed=3), cols)
    expected = kernels.dequantize_rows(weight, first=1, count=4).to(torch.bfloat16)
    got = kernels.dequantize_rows(weight, first=1, count=4, out=torch.empty((4, cols), dtype=torch.bfloat16))
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))  # bit for bit


def test_bfloat16_rows_round_ties_to_even_and_keep_nan():
    values = torch.tensor([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -2.5, float("nan"), float("inf"), 0.0] * 6
                          + [0.0] * 28, dtype=torch.float32).reshape(2, 32)  # ties between bf16 neighbours
    weight = BlockWeight("F32", values.view(torch.uint8).reshape(2, -1).contiguous(), 32)
    for build in BUILDS:
        try:
            kernels = _load(build)
        except NativeUnavailable:
            continue
        got = kernels.dequantize_rows(weight, first=0, count=2, out=torch.empty((2, 32), dtype=torch.bfloat16))
        finite = ~values.isnan()
        assert torch.equal(got[finite].view(torch.int16), values[finite].to(torch.bfloat16).view(torch.int16)), build
        assert got[~finite].isnan().all(), build


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_products_equal_a_float64_product_of_the_dequantized_weights(kernels, format_name):
    rows, cols = 37, 768  # rows split unevenly between threads
    weight = BlockWeight.from_gguf(format_name, random_gguf_rows(format_name, rows, cols, seed=2), cols)
    dense = dequantize_reference(weight).double()
    x = torch.randn(11, cols, generator=torch.Generator().manual_seed(3))  # 8 + 3: two groups of rows
    expected = x.double() @ dense.T
    got = kernels.matmul(x, weight)
    scale = (x.double().abs() @ dense.abs().T).max()
    assert torch.allclose(got.double(), expected, rtol=0, atol=float(scale) * 2e-6)
    for m in (1, 3, 8):  # a row's bits do not depend on how many rows share the call
        assert torch.equal(kernels.matmul(x[:m], weight), got[:m])


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_int16_activation_products_are_within_their_bound(kernels, format_name):
    """matmul_q16: the weights exact, each x value off by at most max|x over its group of 32| / 65534."""
    rows, cols = 37, 768
    weight = BlockWeight.from_gguf(format_name, random_gguf_rows(format_name, rows, cols, seed=2), cols)
    dense = dequantize_reference(weight).double()
    x = torch.randn(11, cols, generator=torch.Generator().manual_seed(3))
    x[2, 40] = 30.0  # an outlier: its group's other values get coarser steps
    got = kernels.matmul_q16(x, weight)
    group_max = x.abs().reshape(11, -1, 32).amax(-1, keepdim=True).expand(-1, -1, 32).reshape(11, cols).double()
    bound = block_matmul.Q16_TOLERANCE * (group_max @ dense.abs().T)
    assert ((got.double() - x.double() @ dense.T).abs() <= bound).all()
    for m in (1, 3, 8):  # a row's bits do not depend on how many rows share the call
        assert torch.equal(kernels.matmul_q16(x[:m], weight), got[:m])


@pytest.mark.parametrize("format_name", [name for name in sorted(FORMATS) if FORMATS[name].is_quantized])
def test_int16_activation_products_are_the_same_bits_in_every_build(format_name):
    """The AVX-512 build's 512-bit products (Q4_K, Q6_K, Q8_0: two groups a vector) keep the AVX2
    build's int32 lanes and FMA order, so its bits; 544 columns end the 32-weight formats' rows in an
    odd block (the last one alone), 11 rows are a call of 8 rows and one of 3."""
    builds = []
    for build in BUILDS:
        try:
            builds.append(_load(build))
        except NativeUnavailable:
            pass
    if len(builds) < 2:
        pytest.skip(f"one build runs here ({builds[0].instruction_set}): nothing to compare")
    for cols in (512, 544) if FORMATS[format_name].block_size == 32 else (512, 768):
        weight = BlockWeight.from_gguf(format_name, random_gguf_rows(format_name, 19, cols, seed=7), cols)
        x = torch.randn(11, cols, generator=torch.Generator().manual_seed(8))
        x[1, 5] = 40.0  # an outlier: its group's scale differs from its pair's
        first = builds[0].matmul_q16(x, weight)
        for other in builds[1:]:
            assert torch.equal(other.matmul_q16(x, weight), first), (other.instruction_set, cols)
            assert torch.equal(other.matmul_q16(x[:1], weight), first[:1]), (other.instruction_set, cols)


def _edge_rows(format_name: str, cols: int) -> np.ndarray:
    """Random blocks, then rows at the byte products' edges: Q4_K nibbles 15 (scales and mins 63),
    Q4_1 and Q4_0 nibbles 15 and 0 (Q4_0's weights 7 and -8), Q6_K values u = 0 (weight -32) and u = 63 with sub-scales -128 and 127."""
    rows = random_gguf_rows(format_name, 6, cols, seed=11)
    blocks = rows.reshape(6, cols // FORMATS[format_name].block_size, -1)
    if format_name in ("Q4_1", "Q4_0"):  # fp16 d (and m), then 16 bytes of nibbles
        nibbles = 4 if format_name == "Q4_1" else 2
        blocks[0, :, nibbles:] = 0xFF
        blocks[1, :, nibbles:] = 0x00
    elif format_name == "Q4_K":
        blocks[0, :, 4:] = 0xFF
        blocks[1, :, 16:] = 0x00
    else:
        blocks[0, :, :192] = 0x00
        blocks[0, :, 192:208] = np.array([-128, 127] * 8, dtype=np.int8).view(np.uint8)
        blocks[1, :, :192] = 0xFF
        blocks[1, :, 192:208] = np.array([127, -128] * 8, dtype=np.int8).view(np.uint8)
    return blocks.reshape(6, -1)


def _edge_x(cols: int) -> torch.Tensor:
    """Rows of x whose int16 values meet the byte split's edges: -32767 (high byte -128), +32767
    (high 127, low 255), low bytes 255 and 0, steps of 256, zeros, one outlier."""
    x = torch.randn(10, cols, generator=torch.Generator().manual_seed(12))
    x[0] = 3.0
    x[1] = -3.0
    x[2, 0::2], x[2, 1::2] = 2.0, -2.0
    steps = torch.arange(cols, dtype=torch.float32) % 32  # within a group: 0 .. 31 times 1/31 of the max
    x[3] = steps / 31 * 32767.0 / 32767  # xq = round(j * 32767 / 31): low bytes all over
    x[4] = -(torch.arange(cols, dtype=torch.float32) % 32 * 256 + 255) / 32767  # low byte 255, high bytes 0 .. -32
    x[4, 31::32] = -1.0  # the group's max: xq of the others stays as written
    x[5] = 0.0
    x[6, 40] = 50.0  # an outlier
    x[7, ::32] = -7.0  # each group's largest value negative
    return x


@pytest.mark.parametrize("format_name", ["Q4_0", "Q4_1", "Q4_K", "Q6_K"])
def test_byte_products_at_their_edges_agree_in_every_build(format_name):
    """Q4_K, Q6_K, Q4_1 and Q4_0 (rows of an even number of blocks) multiply x split in two bytes (one row a
    call, Q4_1 and Q4_0 none in the AVX2 build; two in the AVX-512 build) and int16 weights in the same lanes (more rows):
    within the int16 bound, and the same bits in every build, for every number of rows a call (9 = 8 + 1
    mixes both ways in one call)."""
    cols = 512
    weight = BlockWeight.from_gguf(format_name, _edge_rows(format_name, cols), cols)
    dense = dequantize_reference(weight).double()
    x = _edge_x(cols)
    group_max = x.abs().reshape(10, -1, 32).amax(-1, keepdim=True).expand(-1, -1, 32).reshape(10, cols).double()
    bound = block_matmul.Q16_TOLERANCE * (group_max @ dense.abs().T)
    results = {}
    for build in BUILDS:
        try:
            kernels = _load(build)
        except NativeUnavailable:
            continue
        got = kernels.matmul_q16(x, weight)
        assert ((got.double() - x.double() @ dense.T).abs() <= bound).all(), build
        for m in (1, 2, 3, 9):
            assert torch.equal(kernels.matmul_q16(x[:m], weight), got[:m]), (build, m)
        assert torch.equal(kernels.matmul_q16(x[7:8], weight), got[7:8]), build
        results[build] = got
    first = next(iter(results.values()))
    for build, got in results.items():
        assert torch.equal(got, first), build


def test_quantized_by_gguf_then_multiplied(kernels):
    """Weights made by gguf's quantize (the simple formats it can make), end to end."""
    rng = np.random.default_rng(4)
    values = rng.standard_normal((16, 256), dtype=np.float32)
    x = torch.from_numpy(rng.standard_normal((2, 256), dtype=np.float32))
    for format_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        gguf_rows = quantize(values, GGMLQuantizationType[format_name])
        weight = BlockWeight.from_gguf(format_name, gguf_rows, 256)
        dense = torch.from_numpy(dequantize(gguf_rows, GGMLQuantizationType[format_name]).reshape(16, 256))
        assert torch.allclose(kernels.matmul(x, weight), x @ dense.T, atol=1e-4), format_name
        assert torch.allclose(kernels.matmul_q16(x, weight), x @ dense.T, atol=1e-2), format_name  # |x @ w| ~ 16


def test_widened_formats_round_trip_to_gguf():
    for format_name in ("Q4_1", "Q8_0", "Q4_K"):
        gguf_rows = random_gguf_rows(format_name, 3, 256, seed=5)
        assert np.array_equal(BlockWeight.from_gguf(format_name, gguf_rows, 256).to_gguf(), gguf_rows)


def test_bad_inputs_are_refused(kernels):
    weight = BlockWeight.from_gguf("Q4_K", random_gguf_rows("Q4_K", 4, 256, seed=6), 256)
    with pytest.raises(ValueError):
        kernels.matmul(torch.zeros(1, 255), weight)
    with pytest.raises(ValueError):
        kernels.matmul_q16(torch.zeros(1, 255), weight)
    with pytest.raises(IndexError):
        kernels.dequantize_rows(weight, row_ids=torch.tensor([4]))
    with pytest.raises(ValueError):
        BlockWeight.from_gguf("Q4_K", np.zeros((1, 144), dtype=np.uint8), 512)  # not whole blocks
    with pytest.raises(ValueError):
        BlockWeight("IQ2_XS", torch.zeros(1, 66, dtype=torch.uint8), 256)

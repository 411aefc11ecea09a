"""The prefill GEMM over blocks on AMX tiles (kernels/amx_gemm.py) against a float64 product over the
bf16-rounded inputs, for every block format; a row's bits against the row count, the other rows and the
thread count. Runs where the CPU has AMX-BF16 (the others skip, saying why)."""

import pytest
import torch

from kernels import amx_gemm, block_matmul
from kernels.block_formats import FORMATS, BlockWeight
from kernels.native_build import NativeUnavailable
from store.model_store import radixserve_home
from tests.kernels.test_block_matmul import random_gguf_rows


@pytest.fixture(scope="module")
def amx():
    try:
        return amx_gemm.load(radixserve_home() / "kernels")
    except NativeUnavailable as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def blocks():
    return block_matmul.load_best(radixserve_home() / "kernels", variant="avx2")


def random_weight(format_name: str, rows: int, cols: int, seed: int = 1) -> BlockWeight:
    return BlockWeight.from_gguf(format_name, random_gguf_rows(format_name, rows, cols, seed), cols)


def bf16_reference(x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """x @ dense^T over the inputs rounded to bf16 (to nearest even), summed in float64."""
    return (x.bfloat16().double() @ dense.bfloat16().double().T).float()


def assert_close_to(y: torch.Tensor, reference: torch.Tensor):
    # float32 sums of K products (up to 4096 here): a few ulps of the largest partial sum
    scale = reference.abs().max().item()
    assert (y - reference).abs().max().item() <= 2e-6 * scale * 8


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_every_format_against_the_bf16_product(amx, blocks, format_name):
    rows, cols = 96, 512  # 96: a panel of three tile pairs
    weight = random_weight(format_name, rows, cols)
    x = torch.randn(45, cols)  # a whole 32 and an edge of 13
    y = amx.matmul(amx.pack(x), weight)
    assert y.shape == (45, rows) and y.dtype == torch.float32
    assert_close_to(y, bf16_reference(x, blocks.dequantize_rows(weight)))


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_the_weights_multiplied_are_the_dequantized_ones_rounded_to_bf16(amx, blocks, format_name):
    """x = the identity: each product is one weight times 1, exact, so y^T is the weights the tiles saw, bit for bit."""
    weight = random_weight(format_name, 64, 256, seed=6)
    y = amx.matmul(amx.pack(torch.eye(256)), weight)
    assert torch.equal(y.T, blocks.dequantize_rows(weight).bfloat16().float())


@pytest.mark.parametrize("rows,cols", [(608, 256), (64, 4096), (32, 2304)])
def test_panels_and_k_chunks(amx, blocks, rows, cols):
    """Weights wider than a panel (256 rows) and deeper than a K chunk (2048): chunks accumulate in y."""
    weight = random_weight("Q4_K", rows, cols, seed=2)
    x = torch.randn(70, cols)
    assert_close_to(amx.matmul(amx.pack(x), weight), bf16_reference(x, blocks.dequantize_rows(weight)))


def test_a_rows_bits_do_not_depend_on_the_row_count_or_threads(amx):
    weight = random_weight("Q6_K", 256, 2304, seed=3)
    x = torch.randn(100, 2304)
    full = amx.matmul(amx.pack(x), weight)
    for count in (1, 7, 31, 32, 33, 64, 99):
        assert torch.equal(amx.matmul(amx.pack(x[:count]), weight), full[:count])
    assert torch.equal(amx.matmul(amx.pack(x[40:60]), weight), full[40:60])  # other neighbours
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(amx.matmul(amx.pack(x), weight), full)
    finally:
        torch.set_num_threads(threads)


def test_into_the_columns_of_a_wider_output(amx, blocks):
    """Parts of a fused projection write their columns of one output (its row stride is the wider one's)."""
    first, second = random_weight("Q4_K", 64, 256, seed=4), random_weight("Q8_0", 32, 256, seed=5)
    x = torch.randn(40, 256)
    packed = amx.pack(x)
    out = torch.full((40, 96), float("nan"))
    amx.matmul(packed, first, out[:, :64])
    amx.matmul(packed, second, out[:, 64:])
    assert torch.equal(out[:, :64], amx.matmul(packed, first))
    assert torch.equal(out[:, 64:], amx.matmul(packed, second))


def test_packed_rows_pad_with_zeros_and_round_to_nearest_even(amx):
    x = torch.randn(5, 64)
    packed = amx.pack(x)
    assert packed.data.shape == (32, 64) and packed.rows == 5
    assert torch.equal(packed.data[:5], x.bfloat16())  # torch rounds to nearest even too
    assert not packed.data[5:].float().any()


def test_shapes_it_does_not_take_are_refused(amx):
    weight = random_weight("Q8_0", 48, 256)  # 48 rows: not a multiple of 32
    assert not amx.supports(weight)
    with pytest.raises(ValueError, match="multiples of 32"):
        amx.matmul(amx.pack(torch.randn(3, 256)), weight)
    with pytest.raises(ValueError, match="columns against"):
        amx.matmul(amx.pack(torch.randn(3, 512)), random_weight("Q8_0", 32, 256))
    with pytest.raises(ValueError, match="float32 with contiguous rows"):
        amx.pack(torch.randn(3, 40))


@pytest.mark.parametrize("format_name", ["Q4_1", "Q4_K"])
def test_over_the_interleaved_copy_the_same_bits_as_over_the_blocks(amx, format_name):
    from kernels import cpu_gemm_q8

    try:
        interleaved = cpu_gemm_q8.load(radixserve_home() / "kernels", variant="avx512_vnni")
    except NativeUnavailable as error:
        pytest.skip(str(error))
    weight = random_weight(format_name, 320, 2304, seed=7)  # a panel and a part, a K chunk and a part
    copy = interleaved.repack(weight)
    assert amx.reads(copy)
    x = torch.randn(45, 2304)
    packed = amx.pack(x)
    assert torch.equal(amx.matmul_interleaved(packed, copy), amx.matmul(packed, weight))
    with pytest.raises(ValueError, match="interleaved rows"):
        amx.matmul_interleaved(amx.pack(torch.randn(2, 256)), copy)

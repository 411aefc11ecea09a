"""The float32 prefill GEMM over blocks with FMA (kernels/fma_gemm.py) against a float64 product over the
dequantized weight, for every block format; the panels from the interleaved decode copies against those from the
blocks; a row's bits against the row count, the other rows and the thread count. Runs where the CPU has AVX2,
FMA and F16C and a compiler (elsewhere it skips, saying why)."""

import pytest
import torch

from kernels import block_matmul, cpu_gemm_q8, fma_gemm
from kernels.block_formats import FORMATS
from kernels.native_build import NativeUnavailable
from store.model_store import radixserve_home
from tests.kernels.test_amx_gemm import random_weight


@pytest.fixture(scope="module")
def fma():
    try:
        return fma_gemm.load(radixserve_home() / "kernels")
    except NativeUnavailable as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def blocks():
    return block_matmul.load_best(radixserve_home() / "kernels", variant="avx2")


@pytest.fixture(scope="module")
def q8_avx2():
    return cpu_gemm_q8.load(radixserve_home() / "kernels", variant="avx2")


def assert_close_to(y: torch.Tensor, reference: torch.Tensor, cols: int):
    # float32 sums of `cols` products: a few ulps of the largest partial sum
    scale = (reference.abs().max().item() + 1) * cols ** 0.5
    assert (y.double() - reference).abs().max().item() <= 4e-7 * scale


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_every_format_against_the_float64_product(fma, blocks, format_name):
    rows, cols = 272, 512  # 272: a whole 256-row panel and a 16-row one; K of two 256-chunks
    weight = random_weight(format_name, rows, cols)
    x = torch.randn(45, cols)  # 7 whole micro-tiles of 6 rows and an edge of 3
    y = fma.matmul(x, weight)
    assert y.shape == (45, rows) and y.dtype == torch.float32
    assert_close_to(y, x.double() @ blocks.dequantize_rows(weight).double().T, cols)


@pytest.mark.parametrize("format_name", sorted(FORMATS))
def test_the_weights_multiplied_are_the_dequantized_ones(fma, blocks, format_name):
    """x = the identity: each sum is one weight times 1 plus zeros, exact, so y^T is the weights bit for bit."""
    weight = random_weight(format_name, 32, 256, seed=6)
    y = fma.matmul(torch.eye(256), weight)
    assert torch.equal(y.T, blocks.dequantize_rows(weight))


@pytest.mark.parametrize("format_name", cpu_gemm_q8.Q16_AVX2_FORMATS)
def test_panels_from_the_interleaved_copy_give_the_same_bits(fma, q8_avx2, format_name):
    weight = random_weight(format_name, 48, 768, seed=3)
    copy = q8_avx2.repack(weight)
    assert fma.reads(copy)
    x = torch.randn(13, 768)
    assert torch.equal(fma.matmul_interleaved(x, copy), fma.matmul(x, weight))


def test_a_rows_bits_do_not_depend_on_the_row_count_the_other_rows_or_the_threads(fma):
    weight = random_weight("Q4_K", 64, 512, seed=4)
    x = torch.randn(29, 512)
    y = fma.matmul(x, weight)
    assert torch.equal(fma.matmul(x[7:8].clone(), weight), y[7:8])
    assert torch.equal(fma.matmul(x[3:14].clone(), weight), y[3:14])
    other = x.clone()
    other[0] = torch.randn(512) * 100
    assert torch.equal(fma.matmul(other, weight)[1:], y[1:])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(fma.matmul(x, weight), y)
    finally:
        torch.set_num_threads(threads)


def test_writes_into_the_columns_of_a_wider_output_and_reads_strided_rows(fma):
    weight = random_weight("Q4_1", 32, 256, seed=5)
    wide_x = torch.randn(10, 512)
    x = wide_x[:, 128:384]  # rows 512 floats apart
    out = torch.full((10, 96), 7.0)
    fma.matmul(x, weight, out[:, 32:64])
    assert torch.equal(out[:, 32:64], fma.matmul(x.contiguous(), weight))
    assert (out[:, :32] == 7).all() and (out[:, 64:] == 7).all()


def test_bad_shapes_are_errors(fma, q8_avx2):
    with pytest.raises(ValueError, match="rows a multiple of 16"):
        fma.matmul(torch.randn(2, 256), random_weight("Q4_1", 40, 256))
    with pytest.raises(ValueError, match="float32"):
        fma.matmul(torch.randn(2, 256).double(), random_weight("Q4_1", 32, 256))
    with pytest.raises(ValueError, match=r"\(M, 256\)"):
        fma.matmul(torch.randn(2, 128), random_weight("Q4_1", 32, 256))
    q8_0_copy = q8_avx2.repack(random_weight("Q8_0", 32, 256))
    assert not fma.reads(q8_0_copy)
    with pytest.raises(ValueError, match="interleaved rows"):
        fma.matmul_interleaved(torch.randn(2, 256), q8_0_copy)

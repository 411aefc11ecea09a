"""bf16 products inside float32 GEMMs (kernels/bf16_products.py): where oneDNN runs them (AMX), x and the
weight rounded to bf16, float32 accumulation and output, and a row's bits independent of the row count."""

import pytest
import torch

from kernels import bf16_products
from kernels.packed_linear import pack_weight, packed_linear

pytestmark = pytest.mark.skipif(not bf16_products.run_here(),
                                reason="oneDNN runs no bf16 products in float32 GEMMs here (needs AMX)")


def test_the_mode_is_set_only_inside_and_rounds_the_inputs_not_the_output():
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(40, 512, generator=generator), torch.randn(96, 512, generator=generator)
    before = torch.backends.mkldnn.matmul.fp32_precision
    with bf16_products.bf16_products():
        product = x @ weight.T
    assert torch.backends.mkldnn.matmul.fp32_precision == before
    assert torch.equal(x @ weight.T, torch.nn.functional.linear(x, weight))  # float32 again outside
    rounded = x.bfloat16().double() @ weight.bfloat16().double().T
    torch.testing.assert_close(product.double(), rounded, atol=1e-4, rtol=1e-5)
    assert product.dtype == torch.float32 and not torch.equal(product, x @ weight.T)


@pytest.mark.parametrize("packed", [True, False])
def test_a_rows_bits_do_not_depend_on_the_row_count(packed):
    generator = torch.Generator().manual_seed(1)
    x, weight = torch.randn(300, 576, generator=generator), torch.randn(1536, 576, generator=generator)
    packed_weight = pack_weight(weight)

    def gemm(rows):
        with bf16_products.bf16_products():
            return packed_linear(rows, packed_weight, None) if packed else rows @ weight.T

    every = gemm(x)
    for first, count in ((0, 1), (7, 1), (0, 3), (10, 8), (100, 17), (0, 64), (150, 150)):
        assert torch.equal(gemm(x[first:first + count]), every[first:first + count]), (first, count)

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
@pytest.mark.parametrize("out_features, in_features", [(1536, 576), (96, 64)])
def test_a_rows_bits_do_not_depend_on_the_row_count_from_min_rows(packed, out_features, in_features):
    """Padded to MIN_ROWS (a narrow weight's 1- and 2-row products took another kernel without it)."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(300, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator)
    packed_weight = pack_weight(weight)

    def gemm(rows):
        with bf16_products.bf16_products():
            padded = bf16_products.padded_rows(rows)
            return (packed_linear(padded, packed_weight, None) if packed else padded @ weight.T)[:rows.shape[0]]

    every = gemm(x)
    for first, count in ((0, 1), (7, 1), (0, 3), (10, 8), (100, 17), (0, 64), (150, 150)):
        assert torch.equal(gemm(x[first:first + count]), every[first:first + count]), (first, count)

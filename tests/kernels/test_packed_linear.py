"""oneDNN's prepacked linear against the plain product it replaces."""

import pytest
import torch
import torch.nn.functional as F

from kernels import packed_linear

pytestmark = pytest.mark.skipif(
    not packed_linear.is_available(torch.device("cpu"), torch.float32), reason="no oneDNN in this torch build"
)


@pytest.mark.parametrize("num_rows", [1, 3, 16, 257])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_plain_linear(num_rows, with_bias):
    generator = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(96, 48, generator=generator)
    bias = torch.randn(96, generator=generator) if with_bias else None
    x = torch.randn(num_rows, 48, generator=generator)
    packed = packed_linear.pack_weight(weight)
    expected = F.linear(x.double(), weight.double(), None if bias is None else bias.double()).float()
    assert torch.allclose(packed_linear.packed_linear(x, packed, bias), expected, atol=1e-4, rtol=1e-5)


def test_non_contiguous_input():
    weight = torch.randn(32, 16)
    x = torch.randn(16, 10).t()  # (10, 16), not contiguous
    out = packed_linear.packed_linear(x, packed_linear.pack_weight(weight), None)
    assert torch.allclose(out, x @ weight.t(), atol=1e-5)


def test_not_offered_off_cpu_float32():
    assert not packed_linear.is_available(torch.device("cpu"), torch.bfloat16)
    assert not packed_linear.is_available(torch.device("cuda"), torch.float32)

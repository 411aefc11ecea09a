import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from kernels.rms_norm import rms_norm


def _hf_norm(weight: torch.Tensor, eps: float) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(weight.shape[0], eps=eps).to(weight.dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm


@pytest.mark.parametrize("shape", [(5, 64), (2, 3, 96), (1, 576)])
def test_matches_hf_in_float32(shape):
    torch.manual_seed(0)
    x = torch.randn(shape) * 3
    weight = torch.randn(shape[-1])
    expected = _hf_norm(weight, 1e-5)(x)
    torch.testing.assert_close(rms_norm(x, weight, 1e-5), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
def test_follows_hf_dtype_order_in_bfloat16(weight_dtype):
    torch.manual_seed(0)
    x = (torch.randn(7, 128) * 5).bfloat16()
    weight = torch.randn(128).to(weight_dtype)
    expected = _hf_norm(weight, 1e-6)(x)
    got = rms_norm(x, weight, 1e-6)
    assert got.dtype == expected.dtype
    assert torch.equal(got, expected)


def test_eps_guards_zero_input():
    out = rms_norm(torch.zeros(2, 8), torch.ones(8), 1e-6)
    assert torch.equal(out, torch.zeros(2, 8))

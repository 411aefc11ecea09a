import torch
import torch.nn.functional as F

from kernels.activation import silu_and_mul


def test_gate_is_first_half():
    torch.manual_seed(0)
    gate, up = torch.randn(4, 6), torch.randn(4, 6)
    out = silu_and_mul(torch.cat([gate, up], dim=-1))
    assert out.shape == (4, 6)
    torch.testing.assert_close(out, gate * torch.sigmoid(gate) * up)


def test_matches_separate_projections_in_bfloat16():
    torch.manual_seed(0)
    x = torch.randn(3, 16).bfloat16()
    w_gate, w_up = torch.randn(8, 16).bfloat16(), torch.randn(8, 16).bfloat16()
    fused = silu_and_mul(x @ torch.cat([w_gate, w_up]).T)
    assert torch.equal(fused, F.silu(x @ w_gate.T) * (x @ w_up.T))

"""Gated MLP activations on a fused gate/up projection: SwiGLU and GeGLU (Gemma's gelu tanh)."""

import torch.nn.functional as F
from torch import Tensor


def silu_and_mul(gate_up: Tensor) -> Tensor:
    """gate_up (..., 2*I) -> (..., I): silu(gate) * up, gate being the first half.

    The model projects gate and up with one matmul (weights concatenated gate first), so the
    two halves arrive side by side in the last dimension.
    """
    gate, up = gate_up.chunk(2, dim=-1)  # (..., I) each, views
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: Tensor) -> Tensor:
    """gate_up (..., 2*I) -> (..., I): gelu(gate, tanh approximation) * up, gate the first half."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up

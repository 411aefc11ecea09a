"""SwiGLU activation on a fused gate/up projection."""

import torch.nn.functional as F
from torch import Tensor


def silu_and_mul(gate_up: Tensor) -> Tensor:
    """gate_up (..., 2*I) -> (..., I): silu(gate) * up, gate being the first half.

    The model projects gate and up with one matmul (weights concatenated gate first), so the
    two halves arrive side by side in the last dimension.
    """
    gate, up = gate_up.chunk(2, dim=-1)  # (..., I) each, views
    return F.silu(gate) * up

"""RMSNorm, in the exact dtype order of HF's LlamaRMSNorm.

The order matters for bit-level agreement in half precision: normalise in float32, cast the
result back to the input dtype, and only then multiply by the weight (in the promoted dtype
of weight and input, as HF does).
"""

import torch
import torch.nn.functional as F
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x (..., d), weight (d,) -> (..., d): x / rms(x) * weight, statistics in float32."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # One fused op instead of six; in float32 the order question does not arise.
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return rms_norm_reference(x, weight, eps)


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF's LlamaRMSNorm step by step (the order half precision needs)."""
    input_dtype = x.dtype
    x32 = x.float()
    variance = x32.pow(2).mean(-1, keepdim=True)  # (..., 1)
    normed = (x32 * torch.rsqrt(variance + eps)).to(input_dtype)
    return weight * normed

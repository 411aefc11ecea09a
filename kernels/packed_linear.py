"""Linear layers on oneDNN's prepacked weight layout (CPU, float32 or bfloat16).

oneDNN reorders a weight once into the blocked layout its GEMM kernels read,
instead of repacking it on every call: 1.1x faster for prefill GEMMs, 2.2x at 16
rows, 1.5x at one row (docs/performance.md).

These are private torch ops (the ones inductor's CPU freezing uses), so the
plain path stays the reference: `is_available()` says whether this path can
run, and tests compare the two.
"""

import os

import torch
from torch import Tensor

# The batch-size hint the layout is chosen for. Any M runs on the result; 256
# measured best at M = 1 and M = 1024 alike.
PACK_BATCH_HINT = 256


def is_available(device: torch.device, dtype: torch.dtype) -> bool:
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def bf16_is_available() -> bool:
    """Whether this torch's oneDNN runs bf16 GEMMs (whether the CPU does so natively is
    kernels/cpu_features.py's question)."""
    return is_available(torch.device("cpu"), torch.float32) and torch.ops.mkldnn._is_mkldnn_bf16_supported()


# oneDNN caches one primitive per GEMM shape (the step's token count is part of it): its
# default 1024 grew with every prompt length, 64 kept speed (docs/performance.md). oneDNN
# reads the variable once, at its first primitive; a user's value wins.
PRIMITIVE_CACHE_CAPACITY = "64"


def pack_weight(weight: Tensor) -> Tensor:
    """weight (out, in), as F.linear takes it, float32 or bfloat16 -> an opaque oneDNN tensor of its dtype."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", PRIMITIVE_CACHE_CAPACITY)
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_BATCH_HINT)


def packed_linear(x: Tensor, packed_weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (M, in) -> (M, out) = x @ weight^T + bias, in the packed weight's dtype (x must have it)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed_weight, bias, "none", [], "")


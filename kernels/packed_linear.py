"""Linear layers on oneDNN's prepacked weight layout (CPU, float32).

oneDNN reorders a weight once into the blocked layout its GEMM kernels read,
instead of repacking it on every call. Measured on the 2-core AVX2 machines,
over 283 MB of (3072, 576) weights:

    rows M   plain x @ W^T   prepacked
    1        13-17 GB/s      23 GB/s      (decode: bound by the weight stream)
    16       33 GFLOP/s      73 GFLOP/s   (batched decode)
    1024     119 GFLOP/s     127 GFLOP/s  (prefill)

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


# oneDNN caches one primitive per GEMM shape, and the token count of a step is
# part of the shape, so with its default capacity (1024) the cache kept growing
# with every new prompt length: measured, half the RSS creep over 1,000 mixed
# requests. 64 entries covered a serving mix at unchanged speed (measured).
# oneDNN reads the variable once, at its first primitive; a user's value wins.
PRIMITIVE_CACHE_CAPACITY = "64"


def pack_weight(weight: Tensor) -> Tensor:
    """weight (out, in), as F.linear takes it -> an opaque oneDNN tensor."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", PRIMITIVE_CACHE_CAPACITY)
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_BATCH_HINT)


def packed_linear(x: Tensor, packed_weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (M, in) -> (M, out) = x @ weight^T + bias."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed_weight, bias, "none", [], "")

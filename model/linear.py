"""The linear layer the model is built with: the reference that every backend's faster layer matches."""

import torch
from torch import Tensor, nn


class Linear(nn.Module):
    """y = x @ weight^T (+ bias), weight (out, in) as HF stores it.

    The loader fills `weight` (and `bias`); the execution backend may then swap the
    module for a faster layer object of its own (model/backends), as gpt-fast's
    `convert_for_runtime` swaps nn.Linear. This layout is also the fast one for bf16:
    measured on these CPUs, x @ W^T runs ~8x faster than with W transposed.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)

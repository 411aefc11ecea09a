"""The CPU backend's linear layer: oneDNN's prepacked GEMM, and a C kernel for few rows.

oneDNN reorders the weight once into the blocked layout its GEMM reads
(kernels/packed_linear.py). Inputs of up to `few_rows_max` rows (decode) go to a C
kernel over the GGUF blocks of the weight, or over a row-major float32 copy
(kernels/cpu_matvec.py); where that limit lies is measured per weight shape at load
(crossover.py).
"""

from collections.abc import Callable

from torch import Tensor, nn

from kernels.packed_linear import packed_linear


class CpuLinear(nn.Module):
    """x (M, in) -> x @ W^T + bias (M, out), float32."""

    def __init__(self, packed_weight: Tensor, bias: Tensor | None, out_features: int,
                 few_rows: Callable[[Tensor], Tensor] | None = None, few_rows_max: int = 0):
        super().__init__()
        self.packed_weight = packed_weight  # opaque oneDNN tensor
        self.bias = bias
        self.out_features = out_features
        self.few_rows = few_rows  # x (m, in) -> x @ W^T (m, out), for m <= few_rows_max
        self.few_rows_max = few_rows_max if few_rows is not None else 0

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[0] <= self.few_rows_max:
            y = self.few_rows(x)
            return y + self.bias if self.bias is not None else y
        return packed_linear(x, self.packed_weight, self.bias)

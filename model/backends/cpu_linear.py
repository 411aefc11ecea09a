"""The CPU backend's linear layer: a GEMM for many rows, and a C kernel for few rows.

The GEMM is an int8 one over the weight's GGUF blocks (kernels/cpu_gemm_q8.py) or
oneDNN's over a float32 copy reordered once into its blocked layout
(kernels/packed_linear.py). Inputs of up to `few_rows_max` rows (decode) go to a C
kernel over the GGUF blocks of the weight, or over a row-major float32 copy
(kernels/cpu_matvec.py); where that limit lies is measured per weight shape at load
(crossover.py).
"""

from collections.abc import Callable

from torch import Tensor, nn


class CpuLinear(nn.Module):
    """x (M, in) -> x @ W^T + bias (M, out), float32."""

    def __init__(self, large: Callable[[Tensor], Tensor], bias: Tensor | None, out_features: int,
                 few_rows: Callable[[Tensor], Tensor] | None = None, few_rows_max: int = 0):
        super().__init__()
        self.large = large  # x (M, in) -> x @ W^T (M, out), any M
        self.bias = bias
        self.out_features = out_features
        self.few_rows = few_rows  # x (m, in) -> x @ W^T (m, out), for m <= few_rows_max
        self.few_rows_max = few_rows_max if few_rows is not None else 0

    def forward(self, x: Tensor) -> Tensor:
        y = self.few_rows(x) if x.shape[0] <= self.few_rows_max else self.large(x)
        return y + self.bias if self.bias is not None else y

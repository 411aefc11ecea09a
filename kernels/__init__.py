"""Math on tensors for the model: RMSNorm, RoPE, SwiGLU / GeGLU and attention over paged KV.

Every op has a plain torch definition; faster paths are picked per device and dtype and are
tested against it. Imports nothing else from the project.
"""

from kernels.activation import gelu_tanh_and_mul, silu_and_mul
from kernels.attention_inputs import AttentionInputs
from kernels.paged_attention import paged_attention, paged_attention_reference, store_kv
from kernels.rms_norm import rms_norm
from kernels.rotary import RotaryEmbedding, rope_inv_freq

__all__ = [
    "AttentionInputs",
    "gelu_tanh_and_mul",
    "RotaryEmbedding",
    "paged_attention",
    "paged_attention_reference",
    "rms_norm",
    "rope_inv_freq",
    "silu_and_mul",
    "store_kv",
]

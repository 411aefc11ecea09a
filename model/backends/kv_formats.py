"""Which stored KV formats (kernels/kv_format.py) each backend reads, and on which devices. Checked before
a backend is built (the engine, and `serve` before it loads anything): a format a backend cannot read is
an error that names the format, the backend and what to use instead, never a silent fallback."""

from __future__ import annotations

import torch

from kernels.kv_format import C_KV_DTYPES

FLOAT8_MIN_CUDA_CAPABILITY = (8, 9)  # Ada / Hopper and newer: fp8 (e4m3) in hardware


def float8_device_unfit(device: torch.device) -> str | None:
    """Why float8 KV does not run on `device`, or None: the CPU (the reference) and CUDA devices of compute
    capability >= 8.9 run it."""
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if tuple(capability) >= FLOAT8_MIN_CUDA_CAPABILITY:
            return None
        return (f"float8 KV needs a CUDA device with fp8 (compute capability >= "
                f"{'.'.join(map(str, FLOAT8_MIN_CUDA_CAPABILITY))}), and {torch.cuda.get_device_name(device)} is "
                f"{'.'.join(map(str, capability))}; use --kv-dtype int8 or bfloat16 on it")
    return f"float8 KV runs on the CPU and on CUDA devices with fp8, not {device.type}; use --kv-dtype int8 or bfloat16"


def cpu_kv_unfit(kv_dtype: str, device: torch.device) -> str | None:
    if kv_dtype in C_KV_DTYPES:
        return None
    return (f"the cpu backend's C kernels read {', '.join(C_KV_DTYPES)} KV, not {kv_dtype}; use --backend torch "
            f"for {kv_dtype} KV, or --kv-dtype int8 on the cpu backend (about the same bytes a token)")


def torch_kv_unfit(kv_dtype: str, device: torch.device) -> str | None:
    return float8_device_unfit(device) if kv_dtype == "float8" else None

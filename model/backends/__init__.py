"""Execution backends, registered by name and chosen once per loaded model.

    select_backend(device, dtype, config, choice)  # choice: "auto", "torch" or "cpu"

`auto` takes `cpu` where it runs (CPU, float32) and `torch` elsewhere (CUDA, bfloat16);
naming a backend that cannot run here is an error, not a silent fallback. Inside `cpu`,
what a machine lacks (no C compiler, no AVX2, a model the fused kernels do not fit)
falls back op by op, each fallback with its reason in describe().
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from kernels import block_matmul, cpu_decode_ops, cpu_matvec, packed_linear
from kernels.native_build import FIND_COMPILER, NativeUnavailable
from model.backends.base import Backend, BackendPlan, LinearPlan, StepPolicy
from model.backends.cpu_backend import MEASURE, CpuBackend
from model.backends.torch_backend import TorchBackend
from model.config import ModelConfig

__all__ = ["BACKEND_CHOICES", "Backend", "BackendPlan", "LinearPlan", "StepPolicy", "check_backend_choice",
           "select_backend"]


def _cpu_unfit(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `cpu` cannot run here, or None."""
    if device.type != "cpu":
        return f"runs on the CPU, not {device.type}"
    if dtype != torch.float32:
        return f"runs float32, not {str(dtype).removeprefix('torch.')}"
    if not packed_linear.is_available(device, dtype):
        return "this torch has no oneDNN prepacked linear ops"
    return None


def _make_cpu(config: ModelConfig, build_dir: Path, compiler: str | None, crossover: str) -> Backend:
    fallbacks = []
    try:
        matvec = cpu_matvec.load(build_dir, compiler)
    except NativeUnavailable as error:
        matvec = None
        fallbacks.append(f"few-rows C kernels off ({error}): oneDNN for every row count")
    try:
        ops = cpu_decode_ops.load(build_dir, compiler)
    except NativeUnavailable as error:
        ops = None
        fallbacks.append(f"fused C ops off ({error}): torch ops")
    if ops is not None and not ops.fits(config.hidden_size, config.intermediate_size, config.num_heads,
                                        config.num_kv_heads, config.head_dim):
        ops = None
        fallbacks.append("fused C ops off (the model's sizes are outside their limits): torch ops")
    return CpuBackend(matvec, ops, tuple(fallbacks), crossover,
                      functools.partial(block_matmul.load_best, build_dir, compiler))


# name -> what it needs to run here (None: runs)
_REQUIREMENTS: dict[str, Callable[[torch.device, torch.dtype], str | None]] = {
    "cpu": _cpu_unfit,
    "torch": lambda device, dtype: None,
}
BACKEND_CHOICES = ("auto", *_REQUIREMENTS)
_AUTO_ORDER = ("cpu", "torch")  # the first that runs here


def check_backend_choice(choice: str, device: torch.device | str, dtype: torch.dtype) -> None:
    """Raises ValueError (one line) when `choice` is unknown or cannot run on device/dtype."""
    if choice not in BACKEND_CHOICES:
        raise ValueError(f"backend must be one of {', '.join(BACKEND_CHOICES)}, got {choice!r}")
    reason = None if choice == "auto" else _REQUIREMENTS[choice](torch.device(device), dtype)
    if reason is not None:
        raise ValueError(f"backend {choice} {reason}")


def select_backend(device: torch.device | str, dtype: torch.dtype, config: ModelConfig, choice: str = "auto", *,
                   build_dir: Path, compiler: str | None = FIND_COMPILER, crossover: str = MEASURE) -> Backend:
    """The backend for a model of `config` on `device` in `dtype`. `build_dir` caches the C
    kernels; `compiler` None runs `cpu` as a machine without a C compiler gets it;
    `crossover` "fixed" (default: the measured table) or "measure" sets how `cpu` picks its few-rows limits."""
    device = torch.device(device)
    check_backend_choice(choice, device, dtype)
    skipped = []
    for name in _AUTO_ORDER if choice == "auto" else (choice,):
        reason = _REQUIREMENTS[name](device, dtype)
        if reason is not None:
            skipped.append(f"{name} not chosen ({reason})")
            continue
        if name == "cpu":
            return _make_cpu(config, build_dir, compiler, crossover)
        return TorchBackend(device, dtype, tuple(skipped))
    raise AssertionError("torch runs everywhere")

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

from kernels import amx_gemm as amx_gemm_kernels
from kernels import fma_gemm as fma_gemm_kernels
from kernels import (bf16_products, block_matmul, cpu_decode_ops, cpu_gemm_q8, cpu_matvec, cpu_prefill_attention,
                     packed_linear)
from kernels.cpu_features import PORTABLE, resolve_prefill_dtype, resolve_variant, this_cpu
from kernels.native_build import FIND_COMPILER, NativeUnavailable, library_variant
from model.backends.base import Backend, BackendPlan, LinearPlan, StepPolicy
from model.backends.cpu_backend import FLOAT_PREFILL_MAX_BYTES, CpuBackend
from model.backends.cpu_row_limits import FIXED
from model.backends.cpu_linear import BF16_PRODUCTS_MATH, BF16_TENSORS_MATH, FLOAT32_MATH
from model.backends.crossover import bf16_gemm_speedup
from model.backends.kv_formats import cpu_kv_unfit, torch_kv_unfit
from model.backends.torch_backend import TorchBackend
from model.config import ModelConfig

__all__ = ["BACKEND_CHOICES", "PREFILL_ATTENTION_CHOICES", "Backend", "BackendPlan", "LinearPlan", "StepPolicy", "check_backend_choice",
           "check_kv_dtypes", "chosen_backend_name",
           "select_backend"]


# What `cpu` runs prefill attention on: "auto" the C kernel over pages where it builds and fits the model
# (kernels/cpu_prefill_attention.py), its AMX build in bf16 for projections over blocks in bf16 products, else
# torch's SDPA over gathered K/V; "float32" the C kernel's float32 builds only; "sdpa" the torch path always
# (the comparisons bench/prefill_attention_bench.py makes).
PREFILL_ATTENTION_CHOICES = ("auto", "float32", "sdpa")


def _cpu_unfit(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `cpu` cannot run here, or None."""
    if device.type != "cpu":
        return f"runs on the CPU, not {device.type}"
    if dtype != torch.float32:
        return f"runs float32, not {str(dtype).removeprefix('torch.')}"
    if not packed_linear.is_available(device, dtype):
        return "this torch has no oneDNN prepacked linear ops"
    return None


def _make_cpu(config: ModelConfig, build_dir: Path, compiler: str | None, crossover: str, variant_choice: str,
              int8_activations: bool, float_prefill_max_bytes: int | None, decode_activations: str,
              prefill_dtype_choice: str, prefill_attention_choice: str) -> Backend:
    features = this_cpu()
    variant, skipped = resolve_variant(variant_choice, features)
    products = bf16_products.run_here()
    prefill_dtype, bf16_skipped = resolve_prefill_dtype(prefill_dtype_choice, features,
                                                        packed_linear.bf16_is_available(),
                                                        bf16_gemm_speedup, bf16_products=products)
    prefill_math = FLOAT32_MATH if prefill_dtype == "float32" else (
        BF16_PRODUCTS_MATH if products else BF16_TENSORS_MATH)
    fallbacks = list(skipped) + list(bf16_skipped)
    fma_gemm = None
    if prefill_math == FLOAT32_MATH and variant == "avx2":
        try:  # float32 prefill over the blocks where float32 is the fastest GEMM (kernels/fma_gemm.py: where)
            fma_gemm = fma_gemm_kernels.load(build_dir, compiler, variant)
        except NativeUnavailable as error:
            fallbacks.append(f"FMA GEMM over blocks off ({error}): oneDNN over dequantized tiles")
    if float_prefill_max_bytes is None:  # a GEMM over blocks needs no copy (cpu_backend.FLOAT_PREFILL_MAX_BYTES: why)
        float_prefill_max_bytes = 0 if prefill_math.bf16_products or fma_gemm is not None else FLOAT_PREFILL_MAX_BYTES
    gemm_q8 = interleaved = None
    if int8_activations:
        try:
            gemm_q8 = cpu_gemm_q8.load(build_dir, compiler, variant)
        except NativeUnavailable as error:
            fallbacks.append(f"int8 GEMM over blocks off ({error}): oneDNN float32 and the float blocks kernel")
    elif decode_activations == "int16":
        try:  # the same library's int16 products over interleaved rows, for decode (model/backends/decode_copies.py)
            interleaved = cpu_gemm_q8.load(build_dir, compiler, variant)
        except NativeUnavailable as error:
            fallbacks.append(f"int16 decode over interleaved rows off ({error}): over the blocks")
    try:
        matvec = cpu_matvec.load(build_dir, compiler, variant)
    except NativeUnavailable as error:
        matvec = None
        fallbacks.append(f"few-rows C kernels off ({error}): oneDNN for every row count")
    try:
        ops = cpu_decode_ops.load(build_dir, compiler, variant)
    except NativeUnavailable as error:
        ops = None
        fallbacks.append(f"fused C ops off ({error}): torch ops")
    if ops is not None and not ops.fits(config.hidden_size, config.intermediate_size, config.num_heads,
                                        config.num_kv_heads, config.head_dim):
        ops = None
        fallbacks.append("fused C ops off (the model's sizes are outside their limits): torch ops")
    prefill_attention = None
    if prefill_attention_choice == "sdpa":
        fallbacks.append("C prefill attention off (sdpa asked for): SDPA over gathered K/V")
    else:
        try:
            prefill_attention = cpu_prefill_attention.load(build_dir, compiler, variant)
        except NativeUnavailable as error:
            fallbacks.append(f"C prefill attention off ({error}): SDPA over gathered K/V")
    if prefill_attention is not None and not prefill_attention.fits(config.num_heads, config.num_kv_heads,
                                                                    config.head_dim):
        prefill_attention = None
        fallbacks.append("C prefill attention off (the model's heads are outside its limits): SDPA over gathered K/V")
    elif prefill_attention is not None and prefill_attention.instruction_set == PORTABLE and variant != PORTABLE:
        fallbacks.append(f"C prefill attention: the portable build (no {variant} build here)")
    bf16_prefill_attention = None
    if (prefill_attention is not None and prefill_attention_choice == "auto" and prefill_math.bf16_products
            and variant != PORTABLE):
        try:  # bf16 like the GEMMs over blocks (quality: docs/performance.md, "Prefill attention on AMX tiles in bf16")
            bf16_prefill_attention = cpu_prefill_attention.load_amx(build_dir, compiler)
        except NativeUnavailable as error:
            fallbacks.append(f"bf16 prefill attention off ({error}): the float32 C kernel")
    amx_gemm = None
    if prefill_math.bf16_products:
        try:  # the same products as oneDNN's over tiles, on the blocks (docs/performance.md, "Prefill GEMMs on AMX tiles")
            amx_gemm = amx_gemm_kernels.load(build_dir, compiler, variant)
        except NativeUnavailable as error:
            fallbacks.append(f"AMX GEMM over blocks off ({error}): oneDNN over dequantized tiles")
    # what each loaded library was built as (the matvec kernels are AVX2 code on an AVX-512 machine too)
    loaded = (("int8 GEMM", "gemm_q8", gemm_q8), ("matvec", "matvec", matvec), ("decode ops", "decode_ops", ops))
    builds = ", ".join(f"{label} {library_variant(library, variant)}" for label, library, kernels in loaded
                       if kernels is not None)
    instruction_sets = (f"{features.describe()}; kernels: {variant}" + (f" ({builds})" if builds else "")
                        + f"; prefill GEMMs: {prefill_math.name}")
    return CpuBackend(matvec, ops, tuple(fallbacks), crossover,
                      functools.partial(block_matmul.load_best, build_dir, compiler, variant), gemm_q8=gemm_q8,
                      instruction_sets=instruction_sets, float_prefill_max_bytes=float_prefill_max_bytes,
                      decode_activations=decode_activations, prefill_math=prefill_math,
                      prefill_attention=prefill_attention, bf16_prefill_attention=bf16_prefill_attention,
                      interleaved=interleaved, amx_gemm=amx_gemm, fma_gemm=fma_gemm)


# name -> what it needs to run here (None: runs)
_REQUIREMENTS: dict[str, Callable[[torch.device, torch.dtype], str | None]] = {
    "cpu": _cpu_unfit,
    "torch": lambda device, dtype: None,
}
BACKEND_CHOICES = ("auto", *_REQUIREMENTS)
_AUTO_ORDER = ("cpu", "torch")  # the first that runs here
# name -> why it cannot hold KV in a format (kernels/kv_format.py) on a device (None: it can)
_KV_REQUIREMENTS: dict[str, Callable[[str, torch.device], str | None]] = {"cpu": cpu_kv_unfit, "torch": torch_kv_unfit}


def check_backend_choice(choice: str, device: torch.device | str, dtype: torch.dtype) -> None:
    """Raises ValueError (one line) when `choice` is unknown or cannot run on device/dtype."""
    if choice not in BACKEND_CHOICES:
        raise ValueError(f"backend must be one of {', '.join(BACKEND_CHOICES)}, got {choice!r}")
    reason = None if choice == "auto" else _REQUIREMENTS[choice](torch.device(device), dtype)
    if reason is not None:
        raise ValueError(f"backend {choice} {reason}")


def chosen_backend_name(choice: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """The backend select_backend builds for `choice` ("auto": the first of _AUTO_ORDER that runs here)."""
    check_backend_choice(choice, device, dtype)
    if choice != "auto":
        return choice
    return next(name for name in _AUTO_ORDER if _REQUIREMENTS[name](torch.device(device), dtype) is None)


def check_kv_dtypes(choice: str, device: torch.device | str, dtype: torch.dtype, kv_dtype_k: str,
                    kv_dtype_v: str) -> None:
    """Raises ValueError (one line) when the backend `choice` runs to on device/dtype cannot hold K or V
    in its format: the format, the backend and what to use instead. Never picks another backend."""
    name = chosen_backend_name(choice, device, dtype)
    device = torch.device(device)
    chose = f"backend {name}" + (" (what --backend auto runs here)" if choice == "auto" else "")
    for half, kv_dtype in (("K", kv_dtype_k), ("V", kv_dtype_v)):
        reason = _KV_REQUIREMENTS[name](kv_dtype, device)
        if reason is not None:
            raise ValueError(f"{half} in {kv_dtype} cannot be stored on {chose} on {device.type}: {reason}")


def select_backend(device: torch.device | str, dtype: torch.dtype, config: ModelConfig, choice: str = "auto", *,
                   build_dir: Path, compiler: str | None = FIND_COMPILER, crossover: str = FIXED,
                   cpu_kernels: str = "auto", int8_activations: bool = False,
                   float_prefill_max_bytes: int | None = None,
                   decode_activations: str = "int16", prefill_dtype: str = "float32",
                   prefill_attention: str = "auto") -> Backend:
    """The backend for a model of `config` on `device` in `dtype`. `build_dir` caches the C
    kernels; `compiler` None runs `cpu` as a machine without a C compiler gets it;
    `crossover` "fixed" (default: the measured table) or "measure" sets how `cpu` picks its few-rows limits;
    `cpu_kernels` the kernel variant (kernels.cpu_features.VARIANT_CHOICES: "auto" is the best this CPU
    runs, "avx2" or "portable" force a lower one); `int8_activations` whether `cpu` runs the products over
    GGUF blocks with int8 activations (kernels/cpu_gemm_q8.py), prefill and decode, instead of oneDNN float32
    for prefill and the float-activation blocks kernel for decode; `float_prefill_max_bytes` up to which
    size of its projections in prefill's dtype `cpu` keeps a copy of them for prefill (CpuBackend; None:
    cpu_backend.FLOAT_PREFILL_MAX_BYTES, but no copy under bf16 products);
    `decode_activations` what `cpu`'s few-rows kernels over blocks multiply with
    (cpu_backend.DECODE_ACTIVATIONS: "int16" or "float32"); `prefill_dtype` what `cpu`'s prefill GEMMs
    over GGUF blocks multiply in (kernels.cpu_features.PREFILL_DTYPE_CHOICES: "auto" is bfloat16 where the
    CPU has native bf16, else float32); `prefill_attention` what `cpu` runs prefill attention on
    (PREFILL_ATTENTION_CHOICES: "auto" the C kernel over pages where it runs, on AMX in bf16 under bf16
    products; "float32" its float32 builds; "sdpa" torch's)."""
    if prefill_attention not in PREFILL_ATTENTION_CHOICES:
        raise ValueError(f"prefill_attention must be one of {', '.join(PREFILL_ATTENTION_CHOICES)}, "
                         f"got {prefill_attention!r}")
    device = torch.device(device)
    check_backend_choice(choice, device, dtype)
    skipped = []
    for name in _AUTO_ORDER if choice == "auto" else (choice,):
        reason = _REQUIREMENTS[name](device, dtype)
        if reason is not None:
            skipped.append(f"{name} not chosen ({reason})")
            continue
        if name == "cpu":
            return _make_cpu(config, build_dir, compiler, crossover, cpu_kernels, int8_activations,
                             float_prefill_max_bytes, decode_activations, prefill_dtype, prefill_attention)
        return TorchBackend(device, dtype, tuple(skipped))
    raise AssertionError("torch runs everywhere")

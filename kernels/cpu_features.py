"""The CPU's instruction sets, read once, and the kernel variant they admit.

The C kernels are built per variant (kernels/native_build.py) with the -m flags of
the instruction sets it uses; the backend takes the best variant this CPU runs
(`best_variant`) unless told to take a lower one (`serve --cpu-kernels`,
EngineConfig.cpu_kernels: for comparison, and for tests of what other machines get). Below every variant there is the
portable path: torch's own ops, which need no compiler and no particular CPU.

Variants, best first:
- "avx512_vnni": AVX-512 F/BW/VL + VNNI (`vpdpbusd` over 16 lanes), plus AVX2/FMA/F16C;
- "avx2": AVX2 + FMA + F16C (`maddubs` for int8 products; float32 prefill over blocks on the FMA GEMM,
  kernels/fma_gemm.py, since float32 is the fastest GEMM such a CPU has);
- "portable": no C kernels (torch / oneDNN only).
AVX_VNNI (VEX-coded `vpdpbusd` of 256 bits, Alder Lake and later), AVX512_BF16 and AMX
are detected and named; oneDNN picks AMX and BF16 itself where its GEMMs can use them, and prefill
attention has an AMX build of its own (kernels/cpu_prefill_attention.py, `load_amx`) outside these
variants.

Prefill's dtype (`resolve_prefill_dtype`): "auto" takes bfloat16 (oneDNN's GEMMs, through torch) where
the CPU multiplies bf16 natively (AVX512_BF16 or AMX-BF16), oneDNN runs bf16 products inside float32
GEMMs (kernels/bf16_products.py: AMX; a row's bits then do not depend on the row count) and such a GEMM
measured on this machine ran at least BF16_MIN_SPEEDUP times float32's; elsewhere float32. Native is not
enough: an AMD EPYC with AVX512_BF16 ran GEMMs over bf16 tensors ~3x float32 (but no bf16 products, so
"bfloat16" there is asked for only), an Intel Xeon with AVX512_BF16 and no AMX 0.6x, one with AMX 3.2x (bf16 products;
bf16 tensors 5.9x).
"""

import functools
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# /proc/cpuinfo flag -> the name said in describe()
KNOWN_FLAGS = {
    "avx2": "AVX2", "fma": "FMA", "f16c": "F16C",
    "avx512f": "AVX-512F", "avx512bw": "AVX-512BW", "avx512vl": "AVX-512VL",
    "avx512_vnni": "AVX512_VNNI", "avx_vnni": "AVX_VNNI", "avx512_bf16": "AVX512_BF16",
    "amx_tile": "AMX-TILE", "amx_int8": "AMX-INT8", "amx_bf16": "AMX-BF16",
}
PORTABLE = "portable"
# variant -> (the cpuinfo flags it needs, the compiler flags that build it); best first
VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "avx512_vnni": (("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"),
                    ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx2", "-mfma", "-mf16c")),
    "avx2": (("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c")),
}
VARIANT_CHOICES = ("auto", *VARIANTS, PORTABLE)
# Either flag gives native bf16 products: AVX512_BF16's `vdpbf16ps`, or AMX's bf16 tiles.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
PREFILL_DTYPES = ("float32", "bfloat16")
PREFILL_DTYPE_CHOICES = ("auto", *PREFILL_DTYPES)
# "auto" takes bfloat16 where its GEMM ran at least this many times float32's (a margin over noise).
BF16_MIN_SPEEDUP = 1.25


@dataclass(frozen=True)
class CpuFeatures:
    machine: str  # platform.machine()
    flags: frozenset[str]  # the KNOWN_FLAGS this CPU has

    def has(self, *flags: str) -> bool:
        return self.machine in ("x86_64", "AMD64") and all(flag in self.flags for flag in flags)

    def best_variant(self) -> str:
        return next((name for name, (needs, _) in VARIANTS.items() if self.has(*needs)), PORTABLE)

    def has_native_bf16(self) -> bool:
        return any(self.has(flag) for flag in NATIVE_BF16_FLAGS)

    def describe(self) -> str:
        """e.g. "x86_64 with AVX2, FMA, F16C, AVX-512F, ..." in KNOWN_FLAGS' order."""
        present = [label for flag, label in KNOWN_FLAGS.items() if flag in self.flags]
        return f"{self.machine} with {', '.join(present) if present else 'none of ' + '/'.join(KNOWN_FLAGS.values())}"


def resolve_variant(choice: str, features: "CpuFeatures") -> tuple[str, tuple[str, ...]]:
    """(the variant to build, the fallbacks on the way, one line each) for `choice` in
    VARIANT_CHOICES: "auto" takes the best; a named variant this CPU lacks is an error."""
    if choice not in VARIANT_CHOICES:
        raise ValueError(f"cpu kernel variant must be one of {', '.join(VARIANT_CHOICES)}, got {choice!r}")
    best = features.best_variant()
    if choice == "auto":
        skipped = [f"{name} kernels not built (this CPU lacks {_missing(name, features)})"
                   for name in VARIANTS if list(VARIANTS).index(name) < _rank(best)]
        return best, tuple(skipped)
    if choice != PORTABLE and not features.has(*VARIANTS[choice][0]):
        raise ValueError(f"cpu kernel variant {choice} needs {_missing(choice, features)}, which this CPU lacks")
    return choice, (f"{best} kernels not used ({choice} asked for)",) if choice != best else ()


def resolve_prefill_dtype(choice: str, features: "CpuFeatures", onednn_bf16: bool,
                          bf16_speedup: Callable[[], float] | None = None,
                          bf16_products: bool = False) -> tuple[str, tuple[str, ...]]:
    """(the dtype prefill's GEMMs multiply in, the fallbacks on the way) for `choice` in
    PREFILL_DTYPE_CHOICES. `onednn_bf16`: whether this torch's oneDNN runs bf16 GEMMs; `bf16_products`:
    whether it runs bf16 products inside float32 GEMMs here (kernels/bf16_products.py: AMX), whose rows do
    not depend on the row count; `bf16_speedup`: measures bf16 GEMM time over float32's here
    (model.backends.crossover.bf16_gemm_speedup), called for "auto" only where bf16 products run. "auto"
    takes bfloat16 where the CPU (NATIVE_BF16_FLAGS) and oneDNN have it, bf16 products run and it measured
    >= BF16_MIN_SPEEDUP; "bfloat16" asked for where the CPU or oneDNN lacks it is an error."""
    if choice not in PREFILL_DTYPE_CHOICES:
        raise ValueError(f"prefill dtype must be one of {', '.join(PREFILL_DTYPE_CHOICES)}, got {choice!r}")
    lacking = _bf16_lacking(features, onednn_bf16)
    if choice == "bfloat16" and lacking:
        raise ValueError(f"bfloat16 prefill needs native bf16 ({lacking})")
    if choice != "auto":
        return choice, ()
    if lacking:
        return "float32", (f"bfloat16 prefill off ({lacking}): float32 GEMMs",)
    if not bf16_products:
        # GEMMs over bf16 tensors round each output to bf16 and their rows depend on the row count, so a
        # greedy answer could change with a batch or a cached prefix: asked for only (docs/performance.md)
        return "float32", ("bfloat16 prefill off (oneDNN runs no bf16 products in float32 GEMMs here, no AMX; "
                           "bf16 tensors' rows would depend on the batch): float32 GEMMs",)
    if bf16_speedup is None:
        raise ValueError("prefill dtype auto needs bf16_speedup to measure bf16 against float32")
    speedup = bf16_speedup()
    if speedup < BF16_MIN_SPEEDUP:
        return "float32", (f"bfloat16 prefill off (a bf16 GEMM ran {speedup:.2f}x float32's here, under "
                           f"{BF16_MIN_SPEEDUP}x): float32 GEMMs",)
    return "bfloat16", ()


def _bf16_lacking(features: "CpuFeatures", onednn_bf16: bool) -> str:
    """Why bf16 GEMMs are not native here ("" when they are)."""
    if not features.has_native_bf16():
        labels = "/".join(KNOWN_FLAGS[flag] for flag in NATIVE_BF16_FLAGS)
        return f"this CPU lacks {labels}" if features.machine in ("x86_64", "AMD64") else "not x86-64"
    return "" if onednn_bf16 else "this torch's oneDNN has no bf16 GEMM"


def _rank(variant: str) -> int:
    return list(VARIANTS).index(variant) if variant in VARIANTS else len(VARIANTS)


def _missing(variant: str, features: "CpuFeatures") -> str:
    if features.machine not in ("x86_64", "AMD64"):
        return "x86-64"
    return "/".join(KNOWN_FLAGS.get(flag, flag) for flag in VARIANTS[variant][0] if flag not in features.flags)


def read_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuFeatures:
    """This machine's features from the first processor's flags in /proc/cpuinfo (none when unreadable)."""
    flags: set[str] = set()
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return CpuFeatures(platform.machine(), frozenset(flags & KNOWN_FLAGS.keys()))


@functools.cache
def this_cpu() -> CpuFeatures:
    """read_features() of this machine, read once per process."""
    return read_features()

"""Building and loading the project's small C kernels (kernels/csrc).

Each library is plain C with OpenMP and intrinsics (or, the PORTABLE_LIBRARIES,
plain C built without instruction-set flags), built from the sources LIBRARIES
names (plus the shared headers in csrc): no torch headers, so a build takes
about a second with the system C compiler. A library is built per kernel
variant (kernels/cpu_features.py: "avx512_vnni", "avx2") with that variant's -m
flags; LIBRARY_VARIANTS says which variants it has (the matvec kernels are AVX2 code only; the int8
GEMM, the block kernels, the decode ops and prefill attention have an AVX-512 VNNI build too), and `load_library` builds the best of them at
or below the variant asked for. A library may need instruction sets beyond its variant's
(LIBRARY_EXTRA_FLAGS: the AMX builds of prefill attention and of the prefill GEMM over blocks). The library is cached under `build_dir` by the hash of its sources, headers and
flags and loaded with ctypes. `load_library` raises NativeUnavailable, with the
reason in one line, where it cannot run (not x86-64, no AVX2/FMA/F16C, no
compiler, a failed build); callers then keep their torch path, which is also
the tests' reference. `compiler=None` says "no compiler here": tests use it to
run the fallback a machine without one gets.
"""

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from kernels.cpu_features import PORTABLE, VARIANTS, this_cpu

SOURCE_DIR = Path(__file__).parent / "csrc"
COMPILE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")  # and the variant's -m flags (cpu_features.VARIANTS)
REQUIRED_CPU_FLAGS = VARIANTS["avx2"][0]  # the least any library of LIBRARIES needs
# The portable build: no instruction-set flags (plain C, what the compiler vectorizes for the
# machine's baseline); its sources test __AVX2__ to choose their plain-C paths.
PORTABLE_COMPILE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")
# library name -> its C sources in SOURCE_DIR
LIBRARIES = {
    "matvec": ("matvec.c",),
    "decode_ops": ("row_ops.c", "decode_attention.c", "kernel_program.c"),
    "blocks": ("block_matmul.c", "block_matmul_q16.c"),
    "gemm_q8": ("gemm_q8.c",),
    "prefill_attention": ("prefill_attention.c",),
    "prefill_attention_amx": ("prefill_attention.c",),
    "blocks_amx": ("gemm_amx.c",),
    "blocks_fma": ("gemm_fma.c",),
}
# library name -> the variants it is written for, best first (default: avx2 only)
LIBRARY_VARIANTS = {"gemm_q8": ("avx512_vnni", "avx2"), "blocks": ("avx512_vnni", "avx2"),
                    "decode_ops": ("avx512_vnni", "avx2"), "prefill_attention": ("avx512_vnni", "avx2"),
                    "prefill_attention_amx": ("avx512_vnni",), "blocks_amx": ("avx512_vnni",)}
# library name -> (the cpuinfo flags, the compiler flags) it needs beyond its variant's
AMX_BF16_FLAGS = (("amx_tile", "amx_bf16", "avx512_bf16"), ("-mamx-tile", "-mamx-bf16", "-mavx512bf16"))
LIBRARY_EXTRA_FLAGS = {"prefill_attention_amx": AMX_BF16_FLAGS, "blocks_amx": AMX_BF16_FLAGS}
# library name -> its C sources, built with PORTABLE_COMPILE_FLAGS: runs on any CPU with a compiler
PORTABLE_LIBRARIES = {
    "blocks_portable": ("block_matmul.c", "block_matmul_q16.c"),
    "prefill_attention_portable": ("prefill_attention.c",),
}

logger = logging.getLogger("radixserve.kernels")

FIND_COMPILER = "find"  # load_library's default: $CC, else cc, else gcc


def openmp_waits() -> str:
    """How the OpenMP runtime's idle threads wait, as the environment set it when the runtime loaded
    (the `radixserve` command sets GOMP_SPINCOUNT=3000 unless told: server/omp_wait_policy.py)."""
    chosen = [f"{name}={os.environ[name]}" for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if name in os.environ]
    return "OpenMP waits: " + (", ".join(chosen) if chosen else "libgomp's default (spin, then sleep)")


class NativeUnavailable(Exception):
    """A library cannot run here; str(error) is the reason, one line."""


def find_compiler() -> str | None:
    """The C compiler to build with: $CC, else cc, else gcc; None when there is none."""
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def library_variant(name: str, variant: str) -> str | None:
    """The variant library `name` (LIBRARIES) is built as when `variant` is asked for: the best
    it has that is not above `variant` (VARIANTS' order); None for the portable variant or when
    it has none."""
    if variant == PORTABLE:
        return None
    order = list(VARIANTS)
    return next((own for own in LIBRARY_VARIANTS.get(name, ("avx2",)) if order.index(own) >= order.index(variant)),
                None)


def load_library(name: str, build_dir: Path, compiler: str | None = FIND_COMPILER,
                 variant: str = "avx2") -> ctypes.CDLL:
    """Library `name` built (once, cached by content) into build_dir and loaded: one of
    PORTABLE_LIBRARIES as plain C, one of LIBRARIES as the best of its variants at or below
    `variant` (library_variant). `compiler`: a path, FIND_COMPILER, or None (no compiler:
    raises NativeUnavailable)."""
    portable = name in PORTABLE_LIBRARIES
    if portable:
        flags = PORTABLE_COMPILE_FLAGS
    else:
        built_as = library_variant(name, variant)
        if built_as is None:
            raise _unavailable(f"{name}: the portable path was asked for" if variant == PORTABLE
                               else f"{name}: no {variant} variant")
        extra_needs, extra_flags = LIBRARY_EXTRA_FLAGS.get(name, ((), ()))
        needs = (*VARIANTS[built_as][0], *extra_needs)
        if platform.machine() not in ("x86_64", "AMD64") or not cpu_has_flags(needs):
            raise _unavailable(f"{name}: this CPU lacks {'/'.join(needs)}")
        flags = (*COMPILE_FLAGS, *VARIANTS[built_as][1], *extra_flags)
    if compiler == FIND_COMPILER:
        compiler = find_compiler()
    if compiler is None:
        raise _unavailable(f"{name}: no C compiler (cc or gcc, or $CC)")
    sources = [SOURCE_DIR / file_name for file_name in (PORTABLE_LIBRARIES if portable else LIBRARIES)[name]]
    digest = hashlib.sha256()
    for path in [*sources, *sorted(SOURCE_DIR.glob("*.h"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(" ".join(flags).encode())
    library_path = Path(build_dir) / f"{name}-{digest.hexdigest()[:16]}.so"
    if not library_path.is_file():
        _build(compiler, name, sources, library_path, flags)
    try:
        return ctypes.CDLL(str(library_path))
    except OSError as error:
        raise _unavailable(f"{name}: cannot load {library_path} ({error})") from None


def _unavailable(reason: str) -> NativeUnavailable:
    logger.warning("%s; the torch path runs instead", reason)
    return NativeUnavailable(reason)


def _build(compiler: str, name: str, sources: list[Path], library_path: Path, flags: tuple[str, ...]) -> None:
    library_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library_path.parent) as scratch:
        partial = Path(scratch) / library_path.name
        command = [compiler, *flags, f"-I{SOURCE_DIR}", *map(str, sources), "-o", str(partial)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            logger.warning("building %s failed:\n%s", name, result.stderr[-2000:])
            first_error = next((line for line in result.stderr.splitlines() if "error" in line), "see the log")
            raise _unavailable(f"{name}: building failed ({first_error.strip()[:200]})")
        os.replace(partial, library_path)  # atomic: concurrent builders never see half a file


def cpu_has_flags(flags: tuple[str, ...]) -> bool:
    return this_cpu().has(*flags)

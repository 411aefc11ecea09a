"""Building and loading the project's small C kernels (kernels/csrc).

Each library is plain C with OpenMP and AVX2/FMA/F16C intrinsics (or, the
PORTABLE_LIBRARIES, plain C built without instruction-set flags), built from
the sources LIBRARIES names (plus the shared headers in csrc): no torch
headers, so a build takes about a second with the system C compiler. The
library is cached under `build_dir` by the hash of its sources, headers and
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

SOURCE_DIR = Path(__file__).parent / "csrc"
COMPILE_FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
# The portable build: no instruction-set flags (plain C, what the compiler vectorizes for the
# machine's baseline); its sources test __AVX2__ to choose their plain-C paths.
PORTABLE_COMPILE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")
# library name -> its C sources in SOURCE_DIR
LIBRARIES = {
    "matvec": ("matvec.c",),
    "decode_ops": ("row_ops.c", "decode_attention.c"),
    "blocks": ("block_matmul.c",),
}
# library name -> its C sources, built with PORTABLE_COMPILE_FLAGS: runs on any CPU with a compiler
PORTABLE_LIBRARIES = {
    "blocks_portable": ("block_matmul.c",),
}

logger = logging.getLogger("radixserve.kernels")

FIND_COMPILER = "find"  # load_library's default: $CC, else cc, else gcc


class NativeUnavailable(Exception):
    """A library cannot run here; str(error) is the reason, one line."""


def find_compiler() -> str | None:
    """The C compiler to build with: $CC, else cc, else gcc; None when there is none."""
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def load_library(name: str, build_dir: Path, compiler: str | None = FIND_COMPILER) -> ctypes.CDLL:
    """Library `name` (LIBRARIES) built (once, cached by content) into build_dir and loaded.
    `compiler`: a path, FIND_COMPILER, or None (no compiler: raises NativeUnavailable)."""
    portable = name in PORTABLE_LIBRARIES
    flags = PORTABLE_COMPILE_FLAGS if portable else COMPILE_FLAGS
    if not portable and (platform.machine() not in ("x86_64", "AMD64") or not cpu_has_flags(REQUIRED_CPU_FLAGS)):
        raise _unavailable(f"{name}: this CPU lacks {'/'.join(REQUIRED_CPU_FLAGS)}")
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
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return all(flag in words for flag in flags)

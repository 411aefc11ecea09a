"""Building and loading the project's small C kernels (kernels/csrc).

Each library is plain C with OpenMP and AVX2/FMA/F16C intrinsics, built from
the sources LIBRARIES names (plus the shared headers in csrc): no torch
headers, so a build takes about a second with the system C compiler. The
library is cached under `build_dir` by the hash of its sources, headers and
flags and loaded with ctypes. `load_library` returns None where it cannot run (not
x86-64, no AVX2/FMA/F16C, no compiler, a failed build); callers then keep
their torch path, which is also the tests' reference.
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
# library name -> its C sources in SOURCE_DIR
LIBRARIES = {
    "matvec": ("matvec.c",),
    "decode_ops": ("row_ops.c", "decode_attention.c"),
}

logger = logging.getLogger("radixserve.kernels")


def load_library(name: str, build_dir: Path) -> ctypes.CDLL | None:
    """Library `name` (LIBRARIES) built (once, cached by content) into build_dir and loaded."""
    if platform.machine() not in ("x86_64", "AMD64") or not cpu_has_flags(REQUIRED_CPU_FLAGS):
        logger.warning("%s: this CPU lacks %s; the torch path runs instead", name, "/".join(REQUIRED_CPU_FLAGS))
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        logger.warning("%s: no C compiler (cc or gcc, or $CC); the torch path runs instead", name)
        return None
    sources = [SOURCE_DIR / file_name for file_name in LIBRARIES[name]]
    digest = hashlib.sha256()
    for path in [*sources, *sorted(SOURCE_DIR.glob("*.h"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(" ".join(COMPILE_FLAGS).encode())
    library_path = Path(build_dir) / f"{name}-{digest.hexdigest()[:16]}.so"
    if not library_path.is_file() and not _build(compiler, name, sources, library_path):
        return None
    try:
        return ctypes.CDLL(str(library_path))
    except OSError as error:
        logger.warning("%s: cannot load %s (%s); the torch path runs instead", name, library_path, error)
        return None


def _build(compiler: str, name: str, sources: list[Path], library_path: Path) -> bool:
    library_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library_path.parent) as scratch:
        partial = Path(scratch) / library_path.name
        command = [compiler, *COMPILE_FLAGS, f"-I{SOURCE_DIR}", *map(str, sources), "-o", str(partial)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            logger.warning("building %s failed; the torch path runs instead:\n%s", name, result.stderr[-2000:])
            return False
        os.replace(partial, library_path)  # atomic: concurrent builders never see half a file
    return True


def cpu_has_flags(flags: tuple[str, ...]) -> bool:
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return all(flag in words for flag in flags)

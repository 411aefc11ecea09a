"""A fused AVX2 matrix-vector product for batch-1 decode on CPU, float32.

Batch-1 decode streams every weight once per token, so its speed is the
weight stream's. Measured on the 2-core AVX2 machines with the layer shapes of
SmolLM2 (weights out of cache), GB/s:

    shape (out, in)   oneDNN prepacked   this kernel
    (960, 576)        14.3               24.9
    (576, 576)        10.3               21.7
    (3072, 576)       19.7               23.0
    (576, 1536)       16.0               26.3
    (49152, 576)      20.6               23.7

The kernel is plain C with OpenMP, compiled once with the system C compiler
into `build_dir` and loaded with ctypes (no torch headers, so the build takes
about a second). `load()` returns None where it cannot run (no compiler, no
AVX2); callers then keep their plain path, which is also the tests' reference.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>

/* y (rows,) = W (rows, cols) @ x (cols,), W row-major, cols a multiple of 8.
   Four rows at a time share each load of x; rows split statically between the
   OpenMP threads, each streaming its own contiguous share of W. */
void matvec_f32(const float* W, const float* x, float* y, int64_t rows, int64_t cols, int num_threads) {
  int64_t num_blocks = (rows + 3) / 4;
  #pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t block = 0; block < num_blocks; block++) {
    int64_t r = block * 4;
    const float* w = W + r * cols;
    if (rows - r >= 4) {
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
      __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
      for (int64_t c = 0; c < cols; c += 8) {
        __m256 xv = _mm256_loadu_ps(x + c);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + cols + c), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 2 * cols + c), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 3 * cols + c), xv, a3);
      }
      __m256 acc[4] = {a0, a1, a2, a3};
      for (int k = 0; k < 4; k++) {
        float t[8];
        _mm256_storeu_ps(t, acc[k]);
        y[r + k] = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
      }
    } else {
      for (int64_t k = 0; r + k < rows; k++) {
        float s = 0.0f;
        for (int64_t c = 0; c < cols; c++) s += w[k * cols + c] * x[c];
        y[r + k] = s;
      }
    }
  }
}
"""


class CpuMatvec:
    """The loaded kernel. `__call__` computes x (1, in) @ weight^T for a
    row-major (out, in) float32 weight, into a new (1, out) tensor."""

    def __init__(self, library: ctypes.CDLL):
        self._matvec = library.matvec_f32
        self._matvec.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_int]
        self._matvec.restype = None

    @staticmethod
    def fits(weight: Tensor) -> bool:
        return (
            weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and weight.dim() == 2
            and weight.is_contiguous()
            and weight.shape[1] % 8 == 0
        )

    def __call__(self, x: Tensor, weight: Tensor) -> Tensor:
        rows, cols = weight.shape
        x = x.contiguous()
        if x.shape != (1, cols) or x.dtype != torch.float32:
            raise ValueError(f"matvec wants x (1, {cols}) float32, got {tuple(x.shape)} {x.dtype}")
        out = torch.empty((1, rows), dtype=torch.float32)
        self._matvec(weight.data_ptr(), x.data_ptr(), out.data_ptr(), rows, cols, torch.get_num_threads())
        return out


def load(build_dir: Path) -> CpuMatvec | None:
    """Build (once, cached by source hash) and load the kernel; None where it
    cannot run here."""
    if platform.machine() not in ("x86_64", "AMD64") or not _cpu_has_avx2_fma():
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return None
    digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:16]
    library_path = Path(build_dir) / f"cpu_matvec-{digest}.so"
    if not library_path.is_file():
        if not _build(compiler, library_path):
            return None
    try:
        return CpuMatvec(ctypes.CDLL(str(library_path)))
    except OSError:
        return None


def _build(compiler: str, library_path: Path) -> bool:
    library_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library_path.parent) as scratch:
        source = Path(scratch) / "cpu_matvec.c"
        source.write_text(_SOURCE)
        partial = Path(scratch) / library_path.name
        command = [compiler, "-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", str(source), "-o", str(partial)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            return False
        os.replace(partial, library_path)  # atomic: concurrent builders never see half a file
    return True


def _cpu_has_avx2_fma() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags

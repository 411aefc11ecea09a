"""How the process's C allocator keeps freed memory: set by the command line before any thread starts.

A prefill step allocates tensors of tens to hundreds of MiB (a 1B model's gate/up output for 1024 rows is
64 MiB) and frees them within the layer. glibc serves a request above its mmap threshold (at most 32 MiB) with
a fresh mmap and unmaps it on free, so every layer's outputs come back as new pages: a page fault and a
zeroed page per 4 KiB written. On the Llama-3.2-1B-shaped Q4_K_M file a cold 1k prefill in process faulted
~300,000 times (1.2 GB of fresh pages) and spent ~12% of its time in the kernel (docs/performance.md,
"Freed memory kept"). So the `radixserve` command tells glibc (mallopt) to serve every size from the heap
(M_MMAP_MAX 0), to keep what is freed at its top up to 2 GiB (M_TRIM_THRESHOLD), and to use one arena, so
that the engine thread's requests come from that heap too (another arena's heap is at most 64 MiB, and
larger requests there are mapped whatever M_MMAP_MAX says). A freed block is then reused by the next
layer's request of its size, without faults. Peak resident memory is what the largest step needs, as before;
it is not given back between steps.

The user's choice wins: any MALLOC_* variable or GLIBC_TUNABLES in the environment leaves glibc's defaults.
Elsewhere than glibc (musl, macOS) nothing is set, and the line says so.
"""

import ctypes
import ctypes.util
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # glibc's mallopt parameters (malloc.h)
TRIM_THRESHOLD = (1 << 31) - 1  # bytes free at the heap's top before glibc gives them back (a C int)


def keep_freed_memory(environ=os.environ) -> str:
    """Sets the policy above where glibc runs and the user chose nothing; returns a line for the startup log."""
    chosen = sorted(name for name in environ if name.startswith("MALLOC_") or name == "GLIBC_TUNABLES")
    if chosen:
        return "malloc as the environment says (" + ", ".join(chosen) + ")"
    if platform.libc_ver()[0] != "glibc":
        return "malloc as the C library's default (not glibc)"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not all(libc.mallopt(parameter, value) == 1 for parameter, value in settings):
        return "malloc as glibc's default (mallopt refused a setting)"
    return ("malloc keeps freed memory for reuse (one arena, no mmap per request, trimmed above 2 GiB free; "
            "set MALLOC_* or GLIBC_TUNABLES to choose)")

"""Giving the C heap's freed pages back to the system once a load is done (glibc's malloc_trim).

Loading leaves freed memory inside the C allocator's heaps (a tokenizer built to read its
vocabulary and dropped, Rust and numpy temporaries): glibc keeps such pages resident for reuse,
and only `malloc_trim` returns the free pages inside a heap, not just its top. On a 1B model
~0.1 GiB of the server's resident memory after startup was such free pages
(docs/performance.md, "Quantized weights held as blocks"). Another C library (musl, macOS)
has no malloc_trim: there the pages stay, which costs memory, never correctness.
"""

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    return getattr(ctypes.CDLL(name), "malloc_trim", None)


def trim_freed_heap() -> bool:
    """Returns the heaps' free pages to the system; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True

"""The `radixserve` command has glibc keep freed memory for reuse (large requests from the heap, not one mmap
each), unless the user chose."""

import os
import platform
import subprocess
import sys

import pytest

from server.malloc_policy import keep_freed_memory

# Run in a child: 64 MiB from malloc, then whether it lies below the heap's end (sbrk(0)), i.e. in the heap
# rather than in a mapping of its own.
_PROBE = """
import ctypes, ctypes.util, sys
{setup}
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = [ctypes.c_long]
block = libc.malloc(64 << 20)
print(block < libc.sbrk(0))
"""


def _probe(setup: str, env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", _PROBE.format(setup=setup)], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}


def test_the_users_choice_wins():
    for chosen in ({"MALLOC_ARENA_MAX": "4"}, {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}):
        line = keep_freed_memory(dict(chosen))
        assert line.startswith("malloc as the environment says") and next(iter(chosen)) in line


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's mallopt")
def test_large_requests_come_from_the_heap_once_set():
    setup = ("from server.malloc_policy import keep_freed_memory\n"
             "assert keep_freed_memory().startswith('malloc keeps freed memory')")
    assert _probe("", _clean_env()) == "False"  # glibc's default: a mapping of its own
    assert _probe(setup, _clean_env()) == "True"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's mallopt")
def test_the_command_line_sets_it():
    setup = ("from server import cli\n"
             "cli._build_parser = lambda: (_ for _ in ()).throw(SystemExit(0))\n"
             "try:\n    cli.main([])\nexcept SystemExit:\n    pass")
    assert _probe(setup, _clean_env()) == "True"

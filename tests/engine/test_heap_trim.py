"""The engine gives the C heap's freed pages back after loading (engine/heap_trim.py)."""

import platform

import pytest

from engine.heap_trim import trim_freed_heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_pages_go_back_to_the_system_on_glibc():
    assert trim_freed_heap() is True
    assert trim_freed_heap() is True  # any number of times

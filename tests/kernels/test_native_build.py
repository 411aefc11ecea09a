"""Building the C kernels: cached by content, and every reason a library cannot load is logged."""

import logging

import pytest

from kernels import native_build
from store.model_store import radixserve_home


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """A csrc of our own with one library, `probe`, built from probe.c and a shared header."""
    source_dir = tmp_path / "csrc"
    source_dir.mkdir()
    (source_dir / "shared.h").write_text("#define ANSWER 42\n")
    (source_dir / "probe.c").write_text('#include "shared.h"\nint answer(void) { return ANSWER; }\n')
    monkeypatch.setattr(native_build, "SOURCE_DIR", source_dir)
    monkeypatch.setattr(native_build, "LIBRARIES", {"probe": ("probe.c",)})
    if not native_build.cpu_has_flags(native_build.REQUIRED_CPU_FLAGS):
        pytest.skip("this CPU lacks AVX2/FMA/F16C")
    return source_dir


def test_builds_once_and_rebuilds_when_a_header_changes(sources, tmp_path):
    build_dir = tmp_path / "build"
    if native_build.find_compiler() is None:
        pytest.skip("no C compiler here")
    library = native_build.load_library("probe", build_dir)
    assert library.answer() == 42
    (first,) = build_dir.glob("probe-*.so")
    native_build.load_library("probe", build_dir)
    assert list(build_dir.glob("probe-*.so")) == [first]  # reused, not rebuilt
    (sources / "shared.h").write_text("#define ANSWER 7\n")
    assert native_build.load_library("probe", build_dir).answer() == 7
    assert len(list(build_dir.glob("probe-*.so"))) == 2


def test_failed_build_is_logged_with_the_compiler_error(sources, tmp_path, caplog):
    (sources / "probe.c").write_text("int answer(void) { return undeclared_name; }\n")
    if native_build.find_compiler() is None:
        pytest.skip("no C compiler here")
    with caplog.at_level(logging.WARNING, logger="radixserve.kernels"), \
            pytest.raises(native_build.NativeUnavailable, match="probe: building failed .*undeclared_name"):
        native_build.load_library("probe", tmp_path / "build")
    assert "building probe failed" in caplog.text and "undeclared_name" in caplog.text


def test_missing_compiler_is_logged(sources, tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(native_build.shutil, "which", lambda name: None)
    assert native_build.find_compiler() is None
    with caplog.at_level(logging.WARNING, logger="radixserve.kernels"), \
            pytest.raises(native_build.NativeUnavailable, match="probe: no C compiler"):
        native_build.load_library("probe", tmp_path / "build")
    assert "no C compiler" in caplog.text


def test_no_compiler_can_be_said_explicitly(sources, tmp_path):
    with pytest.raises(native_build.NativeUnavailable, match="no C compiler"):
        native_build.load_library("probe", tmp_path / "build", compiler=None)


def _buildable() -> list[tuple[str, str]]:
    """(library, variant) for every build of the project's libraries this CPU runs."""
    pairs = [(name, native_build.PORTABLE) for name in native_build.PORTABLE_LIBRARIES]
    for name in native_build.LIBRARIES:
        for variant in native_build.LIBRARY_VARIANTS.get(name, ("avx2",)):
            needs = (*native_build.VARIANTS[variant][0], *native_build.LIBRARY_EXTRA_FLAGS.get(name, ((), ()))[0])
            if native_build.cpu_has_flags(needs):
                pairs.append((name, variant))
    return pairs


@pytest.mark.parametrize(("name", "variant"), _buildable())
def test_every_build_this_cpu_runs_compiles(name, variant):
    """A compile error in a kernel source must fail here: elsewhere the kernel tests skip a build that
    cannot load (the machine may lack it) and the engine falls back to torch, which would hide it. (The
    shared build directory: a library is cached by its sources' content, so only a build that compiled is
    found there.)"""
    if native_build.find_compiler() is None:
        pytest.skip("no C compiler here")
    native_build.load_library(name, radixserve_home() / "kernels", variant=variant)

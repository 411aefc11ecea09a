"""The AVX2 matvec kernel against torch's product."""

import pytest
import torch

from kernels import cpu_matvec


@pytest.fixture(scope="module")
def matvec(tmp_path_factory):
    kernel = cpu_matvec.load(tmp_path_factory.mktemp("kernels"))
    if kernel is None:
        pytest.skip("no C compiler or no AVX2/FMA here")
    return kernel


@pytest.mark.parametrize("rows, cols", [(1, 8), (3, 16), (4, 64), (7, 576), (961, 576), (576, 1536)])
def test_matches_torch(matvec, rows, cols):
    generator = torch.Generator().manual_seed(rows * cols)
    weight = torch.randn(rows, cols, generator=generator)
    x = torch.randn(1, cols, generator=generator)
    expected = (x.double() @ weight.double().t()).float()
    assert torch.allclose(matvec(x, weight), expected, atol=1e-4, rtol=1e-5)


def test_fits_only_what_it_can_run(matvec):
    assert matvec.fits(torch.randn(4, 16))
    assert not matvec.fits(torch.randn(4, 12))  # columns not a multiple of 8
    assert not matvec.fits(torch.randn(16, 4).t())  # not row-major
    assert not matvec.fits(torch.randn(4, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError):
        matvec(torch.randn(2, 16), torch.randn(4, 16))


def test_built_library_is_reused(tmp_path):
    first = cpu_matvec.load(tmp_path)
    if first is None:
        pytest.skip("no C compiler or no AVX2/FMA here")
    (library,) = tmp_path.glob("cpu_matvec-*.so")
    mtime = library.stat().st_mtime_ns
    assert cpu_matvec.load(tmp_path) is not None
    assert library.stat().st_mtime_ns == mtime

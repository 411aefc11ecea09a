"""The AVX2 matvec kernels against torch's product over the same weight values."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from kernels import cpu_matvec
from kernels.cpu_matvec import BlockWeight


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
    (library,) = tmp_path.glob("matvec-*.so")
    mtime = library.stat().st_mtime_ns
    assert cpu_matvec.load(tmp_path) is not None
    assert library.stat().st_mtime_ns == mtime


def _block_weight(block_format: str, rows: int, cols: int, seed: int) -> tuple[BlockWeight, torch.Tensor]:
    """Random weight quantized by gguf; returns the blocks and their float32 values."""
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    blocks = quantize(values, GGMLQuantizationType[block_format])
    dequantized = dequantize(blocks, GGMLQuantizationType[block_format]).astype(np.float32)
    return BlockWeight.from_gguf(block_format, blocks, cols), torch.from_numpy(dequantized)


@pytest.mark.parametrize("block_format", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows, cols", [(1, 32), (5, 64), (192, 576), (577, 1536)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9])
def test_blocks_match_torch_over_dequantized_weights(matvec, block_format, rows, cols, m):
    weight, values = _block_weight(block_format, rows, cols, seed=rows + cols)
    x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m))
    expected = (x.double() @ values.double().t()).float()
    got = matvec.matmul_blocks(x, weight)
    assert got.shape == (m, rows)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("block_format", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("cols", [576, 1536, 2048])  # one column tile; two; several and a short last one
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(matvec, block_format, cols):
    """A decode of one row and a speculative verify chunk of several must give that row the very same
    bits (greedy outputs with speculation on and off are then identical), whatever the other rows hold."""
    weight, _ = _block_weight(block_format, 67, cols, seed=cols)
    x = torch.randn(16, cols, generator=torch.Generator().manual_seed(cols))
    alone = torch.cat([matvec.matmul_blocks(x[i:i + 1], weight) for i in range(16)])
    for m in range(2, 17):
        assert torch.equal(matvec.matmul_blocks(x[:m], weight), alone[:m]), m
    assert torch.equal(matvec.matmul_blocks(x[5:9], weight), alone[5:9])


def test_fused_blocks_are_row_concatenations(matvec):
    q, q_values = _block_weight("Q4_1", 64, 96, seed=1)
    k, k_values = _block_weight("Q4_1", 32, 96, seed=2)
    fused = BlockWeight.concat([q, k])
    x = torch.randn(2, 96)
    torch.testing.assert_close(matvec.matmul_blocks(x, fused), x @ torch.cat([q_values, k_values]).t(),
                               atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError, match="cannot fuse"):
        BlockWeight.concat([q, _block_weight("Q8_0", 8, 96, seed=3)[0]])


def test_bad_block_weights_are_refused(matvec):
    with pytest.raises(ValueError, match="unknown block format"):
        BlockWeight.from_gguf("IQ2_XS", np.zeros((1, 20), dtype=np.uint8), 32)
    with pytest.raises(ValueError, match="needs uint8 GGUF blocks"):
        BlockWeight.from_gguf("Q4_1", np.zeros((1, 21), dtype=np.uint8), 32)  # not whole blocks
    with pytest.raises(ValueError, match="needs uint8 GGUF blocks"):
        BlockWeight.from_gguf("Q4_1", np.zeros((1, 20), dtype=np.uint8), 48)  # columns not a multiple of 32
    with pytest.raises(ValueError, match="needs contiguous uint8 blocks"):
        BlockWeight("Q4_1", torch.zeros(1, 20, dtype=torch.uint8), 32)  # the file's layout, 20 bytes a block
    weight, _ = _block_weight("Q8_0", 4, 64, seed=0)
    with pytest.raises(ValueError, match="wants x"):
        matvec.matmul_blocks(torch.randn(1, 32), weight)
    with pytest.raises(ValueError, match="wants x"):
        matvec.matmul_blocks(torch.randn(1, 64, dtype=torch.float64), weight)

"""Recorded kernel calls run again from C (kernels/kernel_program.py): a replay computes what the calls
compute on the inputs' new values, and a recording that anything but recordable kernels computed in is
refused with the reason."""

import pytest
import torch

from kernels import block_matmul
from kernels.block_formats import BlockWeight
from kernels.kernel_program import KernelRecorder
from kernels.native_build import NativeUnavailable
from store.model_store import radixserve_home
from tests.kernels.test_block_matmul import random_gguf_rows


@pytest.fixture(scope="module")
def blocks():
    try:
        return block_matmul.load(radixserve_home() / "kernels", variant="avx2")
    except NativeUnavailable as error:
        pytest.skip(str(error))


def _weight(rows: int, cols: int) -> BlockWeight:
    return BlockWeight.from_gguf("Q4_1", random_gguf_rows("Q4_1", rows, cols, seed=3), cols)


def _layer(ops, blocks, weight, norm_weight, x, residual):
    """A decode step's shape in small: add + norm, a product over blocks, SwiGLU."""
    normed = ops.add_rms_norm(residual, x, norm_weight, 1e-5)
    return ops.silu_and_mul(blocks.matmul_q16(normed, weight))


def test_a_replay_computes_the_recorded_calls_on_new_inputs(ops, blocks):
    torch.manual_seed(0)
    weight, norm_weight = _weight(128, 64), torch.rand(64) + 0.5
    x, residual = torch.randn(2, 64), torch.randn(2, 64)
    recorder = KernelRecorder(ops.run_program)
    with torch.inference_mode(), recorder:
        out = _layer(ops, blocks, weight, norm_weight, x, residual)
    program = recorder.program(keep=(x, residual))
    assert program is not None and program.num_calls == 3
    for seed in (1, 2):
        torch.manual_seed(seed)
        new_x, new_residual = torch.randn(2, 64), torch.randn(2, 64)
        x.copy_(new_x)
        residual.copy_(new_residual)
        program.run()
        expected = _layer(ops, blocks, weight, norm_weight, new_x, new_residual.clone())
        assert torch.equal(out, expected)
        assert torch.equal(residual, new_residual + new_x)  # the in-place add replayed too


def test_a_torch_op_that_computes_spoils_a_recording(ops, blocks):
    weight, norm_weight = _weight(128, 64), torch.ones(64)
    recorder = KernelRecorder(ops.run_program)
    with torch.inference_mode(), recorder:
        _layer(ops, blocks, weight, norm_weight, torch.randn(2, 64) * 2, torch.randn(2, 64))
        out = _layer(ops, blocks, weight, norm_weight, torch.randn(2, 64), torch.randn(2, 64))
        out + 1
    assert recorder.program() is None
    assert "computes outside the recorded kernels" in recorder.spoiled


def test_a_copy_where_a_view_was_expected_spoils_a_recording(ops):
    recorder = KernelRecorder(ops.run_program)
    with torch.inference_mode(), recorder:
        torch.empty(4, 8)[:, :4].reshape(16)  # a view, then a reshape that copies
    assert recorder.program() is None and "copied" in recorder.spoiled


def test_a_c_call_that_is_not_recordable_spoils_a_recording(ops, blocks):
    weight = _weight(8, 64)
    recorder = KernelRecorder(ops.run_program)
    with torch.inference_mode(), recorder:
        blocks.dequantize_rows(weight, first=0, count=8)
    assert recorder.program() is None
    assert recorder.spoiled == "blocks_dequantize_rows is not a recordable kernel"


def test_only_one_recording_at_a_time(ops):
    with KernelRecorder(ops.run_program):
        with pytest.raises(RuntimeError, match="already running"):
            with KernelRecorder(ops.run_program):
                pass
    with KernelRecorder(ops.run_program) as recorder:  # the first one's exit let go
        pass
    assert recorder.program() is None and recorder.spoiled == "no kernel was called"

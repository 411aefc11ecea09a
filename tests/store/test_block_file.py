"""Decode over the GGUF blocks a converted model keeps: the same outputs as over its
float32 weights, and every failure to read the blocks named."""

import random

import pytest

from engine.engine_config import EngineConfig
from store.errors import ModelFormatError
from store.gguf_import import BLOCKS_FILE, convert_gguf
from engine.llm_engine import LLMEngine
from store.model_store import radixserve_home
from engine.sampling_params import SamplingParams
from kernels import cpu_matvec
from kernels.cpu_matvec import BLOCKS_MAX_ROWS


@pytest.fixture(scope="module")
def kernels_available():
    if cpu_matvec.load(radixserve_home() / "kernels") is None:
        pytest.skip("no C compiler or no AVX2/FMA/F16C here")


def _quantized_model(tmp_path, tiny_gguf, tie: bool):
    tiny_gguf(tmp_path / "tiny.gguf", "llama", tie_word_embeddings=tie, quantized=True)
    return convert_gguf(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)


def _engine(model_dir, gguf_blocks: bool) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=16 << 20,
                                  gguf_blocks=gguf_blocks))


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("num_requests", [1, BLOCKS_MAX_ROWS["Q4_1"], 12])  # blocks; the row limit; GEMM past it
def test_greedy_outputs_equal_float32_weights(tmp_path, tiny_gguf, kernels_available, tie, num_requests):
    model_dir = _quantized_model(tmp_path, tiny_gguf, tie)
    rng = random.Random(num_requests)
    prompts = [[rng.randrange(3, 200) for _ in range(rng.randrange(2, 40))] for _ in range(num_requests)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    with_blocks = _engine(model_dir, gguf_blocks=True)
    layer = with_blocks.model.layers[0]
    assert layer.self_attn.qkv_proj.block_weight is not None  # the block path is the one running
    assert layer.mlp.gate_up_proj.block_weight.format == "Q4_1"
    assert layer.mlp.down_proj.block_weight is None  # 48 columns: no blocks, float32 kept
    assert with_blocks.model.packed_head.block_weight.format == ("Q8_0" if tie else "Q4_1")  # embedding: Q8_0
    without = _engine(model_dir, gguf_blocks=False)
    assert without.model.layers[0].self_attn.qkv_proj.block_weight is None
    assert with_blocks.generate(prompts, params) == without.generate(prompts, params)


def test_projection_without_float32_copy_once_on_blocks(tmp_path, tiny_gguf, kernels_available):
    """A projection reading blocks drops its row-major float32 weight (only the packed GEMM layout stays)."""
    engine = _engine(_quantized_model(tmp_path, tiny_gguf, tie=True), gguf_blocks=True)
    assert engine.model.layers[0].self_attn.o_proj.weight.numel() == 0


def test_corrupt_blocks_file_is_named(tmp_path, tiny_gguf, kernels_available):
    model_dir = _quantized_model(tmp_path, tiny_gguf, tie=True)
    (model_dir / BLOCKS_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(ModelFormatError) as error:
        _engine(model_dir, gguf_blocks=True)
    assert BLOCKS_FILE in str(error.value)
    _engine(model_dir, gguf_blocks=False)  # the float32 weights alone still load

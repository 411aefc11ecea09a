"""Decode over the GGUF blocks a converted model keeps (its only copy of those weights): the same
outputs as over their dequantized float32 values, and every failure to read the blocks named."""

import random

import pytest

from engine.engine_config import EngineConfig
from engine.speculation_config import SpeculationConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from kernels import cpu_matvec
from kernels.block_formats import FORMATS
from kernels.cpu_matvec import BLOCKS_MAX_ROWS
from kernels.native_build import NativeUnavailable
from store.block_file import BLOCK_FORMATS, BLOCKS_FILE
from store.errors import ModelFormatError
from store.gguf_import import convert_gguf
from store.model_store import radixserve_home


@pytest.fixture(scope="module")
def kernels_available():
    try:
        cpu_matvec.load(radixserve_home() / "kernels")
    except NativeUnavailable as error:
        pytest.skip(str(error))


def _quantized_model(tmp_path, tiny_gguf, tie: bool):
    tiny_gguf(tmp_path / "tiny.gguf", "llama", tie_word_embeddings=tie, quantized=True)
    return convert_gguf(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)


def _engine(model_dir, gguf_blocks: bool, speculative: str = "off") -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=16 << 20,
                                  max_num_batched_tokens=2048, gguf_blocks=gguf_blocks, backend="cpu",
                                  few_rows_crossover="fixed",
                                  speculation=SpeculationConfig(speculative),
                                  # float32 products: greedy answers over blocks are compared with float32 weights'
                                  # (bf16 prefill: tests/engine/test_bf16_prefill.py)
                                  prefill_dtype="float32"))


def test_the_store_keeps_the_formats_the_kernels_read():
    assert set(BLOCK_FORMATS) == set(FORMATS)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("num_requests", [1, BLOCKS_MAX_ROWS["Q4_1"], 12])  # blocks; the row limit; GEMM past it
def test_greedy_outputs_equal_float32_weights(tmp_path, tiny_gguf, kernels_available, tie, num_requests):
    model_dir = _quantized_model(tmp_path, tiny_gguf, tie)
    rng = random.Random(num_requests)
    prompts = [[rng.randrange(3, 200) for _ in range(rng.randrange(2, 40))] for _ in range(num_requests)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    with_blocks = _engine(model_dir, gguf_blocks=True)
    linears = with_blocks.backend.plan().linears  # the block path is the one running
    assert "Q4_1 blocks" in linears["layers.0.self_attn.qkv_proj"].few_rows
    assert linears["layers.0.mlp.gate_up_proj"].few_rows_max == BLOCKS_MAX_ROWS["Q4_1"]
    assert "float32" in linears["layers.0.mlp.down_proj"].few_rows  # 48 columns: no blocks, float32 kept
    head_format = "Q8_0" if tie else "Q4_1"  # the tied head is the embedding: Q8_0
    assert f"{head_format} blocks" in linears["lm_head"].few_rows
    assert f"{head_format} blocks" in with_blocks.backend.describe()
    without = _engine(model_dir, gguf_blocks=False)
    assert "float32 row-major" in without.backend.plan().linears["layers.0.self_attn.qkv_proj"].few_rows
    assert with_blocks.generate(prompts, params) == without.generate(prompts, params)


def test_projection_without_float32_copy_once_on_blocks(tmp_path, tiny_gguf, kernels_available):
    """A projection reading blocks keeps no row-major float32 weight (only the packed GEMM layout)."""
    engine = _engine(_quantized_model(tmp_path, tiny_gguf, tie=True), gguf_blocks=True)
    o_proj = engine.model.layers[0].self_attn.o_proj
    assert not any(param.numel() for param in o_proj.parameters())
    assert [name for name, _ in o_proj.named_buffers()] == []


def test_corrupt_blocks_file_is_named(tmp_path, tiny_gguf, kernels_available):
    model_dir = _quantized_model(tmp_path, tiny_gguf, tie=True)
    (model_dir / BLOCKS_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(ModelFormatError) as error:
        _engine(model_dir, gguf_blocks=True)
    assert BLOCKS_FILE in str(error.value)
    with pytest.raises(ModelFormatError):  # the blocks are those weights' only copy
        _engine(model_dir, gguf_blocks=False)


@pytest.mark.parametrize("num_requests", [1, 3])
def test_speculation_on_blocks_changes_no_output(tmp_path, tiny_gguf, kernels_available, num_requests):
    """Over GGUF blocks speculation changes no greedy output, and drafts never take a step past the blocks
    kernels' row limit (the bits of a row for any row count: tests/kernels/test_cpu_matvec.py)."""
    model_dir = _quantized_model(tmp_path, tiny_gguf, tie=True)
    rng = random.Random(num_requests)
    prompts = []
    for _ in range(num_requests):
        segment = [rng.randrange(3, 200) for _ in range(rng.randrange(4, 12))]
        prompts.append(segment * 3)  # text that repeats, so there is something to draft
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    speculating = _engine(model_dir, gguf_blocks=True, speculative="ngram")
    block_limits = [plan.few_rows_max for plan in speculating.backend.plan().linears.values() if "blocks" in plan.few_rows]
    assert speculating.backend.policy.max_verify_rows_per_step == min(block_limits) == 8
    assert speculating.generate(prompts, params) == _engine(model_dir, gguf_blocks=True).generate(prompts, params)
    assert speculating.metrics.num_accepted_draft_tokens > 0

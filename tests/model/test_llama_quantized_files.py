"""Files made by llama.cpp's own llama-quantize, per weight type: every block tensor the converted
model keeps decodes (C kernels, both builds) to exactly what gguf's dequantize gives, and the cpu
backend on the blocks answers as the torch backend on their dequantized float32 values.

The files are bench.random_gguf's "tiny" shape (random weights, the default model's tokenizer),
made once under $RADIXSERVE_HOME/bench-models."""

import numpy as np
import pytest
import torch

from bench.random_gguf import random_gguf
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.speculation_config import SpeculationConfig
from kernels import block_matmul
from kernels.block_formats import BlockWeight, dequantize_reference
from store.block_file import read_block_file
from store.model_store import pull, radixserve_home
from tests.llama_tools import require_llama_tools

pytestmark = [pytest.mark.llama_tools, pytest.mark.model]

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K"]


def _engine(model_dir, backend: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=16 << 20,
                                  backend=backend, few_rows_crossover="fixed", speculation=SpeculationConfig("off"),
                                  # float32 products: the answers are compared with the torch backend's
                                  prefill_dtype="float32"))


@pytest.mark.parametrize("type_name", TYPES)
def test_llama_quantize_files_run_on_their_blocks(type_name):
    require_llama_tools()
    model_dir = pull(random_gguf("tiny", type_name), progress=False)
    blocks = read_block_file(model_dir)
    assert blocks, "no tensor kept as blocks"
    builds = [block_matmul.load(radixserve_home() / "kernels", portable=p) for p in (False, True)]
    for name, part in blocks.items():
        weight = BlockWeight.from_gguf(part.format, part.rows, part.cols)
        expected = dequantize_reference(weight)
        for kernels in builds:
            assert torch.equal(kernels.dequantize_rows(weight), expected), (name, part.format, kernels.instruction_set)
    on_blocks, reference = _engine(model_dir, "cpu"), _engine(model_dir, "torch")
    assert "weights resident as blocks" in on_blocks.backend.describe()
    prompts = [[int(t) for t in np.random.default_rng(1).integers(100, 40000, 12)]]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    assert on_blocks.generate(prompts, params) == reference.generate(prompts, params)

"""The cpu backend's int8 products over GGUF blocks: a request batched gets exactly what it gets alone."""

import pytest

from engine.engine_config import EngineConfig
from engine.generate import greedy_generate
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from kernels.cpu_features import this_cpu
from store.gguf_import import convert_gguf
from tests.engine.test_engine_batching import _mixed_prompts


@pytest.fixture(scope="module")
def quantized_tiny_dir(tmp_path_factory):
    from tests.conftest import write_tiny_gguf

    if not this_cpu().has("avx2", "fma", "f16c"):
        pytest.skip("this CPU lacks AVX2/FMA/F16C: no int8 kernels")
    root = tmp_path_factory.mktemp("quantized-tiny")
    write_tiny_gguf(root / "tiny.gguf", quantized=True)
    convert_gguf(root / "tiny.gguf", root / "model", progress=False)
    return root / "model"


@pytest.mark.parametrize("cpu_kernels", ["auto", "avx2"])
def test_batched_equals_alone(quantized_tiny_dir, cpu_kernels):
    """A budget of 24 tokens: prefill chunks of many rows and decodes of few share steps."""
    engine = LLMEngine(EngineConfig(model_dir=quantized_tiny_dir, device="cpu", dtype="float32", backend="cpu",
                                    kv_cache_bytes=64 << 20, max_num_batched_tokens=24, cpu_kernels=cpu_kernels,
                                    int8_activations=True))
    assert "int8 GEMM over Q4_1 blocks" in engine.backend.describe()
    prompts = _mixed_prompts(256)[:8]
    expected = [greedy_generate(engine.model, p, 8) for p in prompts]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert outputs == expected

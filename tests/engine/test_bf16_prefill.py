"""The cpu backend's bfloat16 prefill over GGUF blocks (EngineConfig.prefill_dtype): named in describe(),
a copy of the projections at half float32's bytes, close to float32, and a path that agrees with itself
batched and alone."""

import pytest
import torch

from engine.engine_config import EngineConfig
from engine.generate import greedy_generate
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from kernels.cpu_features import this_cpu
from kernels.packed_linear import bf16_is_available
from store.gguf_import import convert_gguf
from tests.engine.test_engine_batching import _mixed_prompts

pytestmark = pytest.mark.skipif(not (bf16_is_available() and this_cpu().has_native_bf16()),
                                reason="this CPU (or torch's oneDNN) has no native bf16 GEMM")


@pytest.fixture(scope="module")
def quantized_tiny_dir(tmp_path_factory):
    from tests.conftest import write_tiny_gguf

    root = tmp_path_factory.mktemp("quantized-tiny-bf16")
    write_tiny_gguf(root / "tiny.gguf", quantized=True)
    convert_gguf(root / "tiny.gguf", root / "model", progress=False)
    return root / "model"


def _engine(model_dir, prefill_dtype: str, float_prefill_max_bytes: int) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", backend="cpu",
                                  kv_cache_bytes=64 << 20, max_num_batched_tokens=24, prefill_dtype=prefill_dtype,
                                  float_prefill_max_bytes=float_prefill_max_bytes))


@pytest.mark.parametrize("copy_bytes, path", [(1 << 30, "oneDNN prepacked over a bfloat16 copy of Q4_1 blocks"),
                                               (0, "torch GEMM over dequantized tiles of Q4_1 blocks (bfloat16)")])
def test_bf16_prefill_is_named_close_to_float32_and_batched_equals_alone(quantized_tiny_dir, copy_bytes, path):
    """A budget of 24 tokens: prefill chunks of many rows (bf16) and decodes of few (float32 blocks kernels)
    share steps."""
    engine = _engine(quantized_tiny_dir, "bfloat16", copy_bytes)
    plan = engine.backend.plan()
    assert plan.linears["layers.0.mlp.gate_up_proj"].large == path
    assert "prefill GEMMs: bfloat16" in engine.backend.describe()
    reference = _engine(quantized_tiny_dir, "float32", copy_bytes)
    if copy_bytes:  # the copy in bf16 holds half the bytes of the float32 one
        notes = [[n for n in e.backend.plan().notes if "copies of the projections" in n][0] for e in (engine, reference)]
        assert "prefill over bfloat16 copies" in notes[0] and "prefill over float32 copies" in notes[1]
        assert engine.backend._float_prefill_bytes < reference.backend._float_prefill_bytes
    # the logits stay float32 (cpu_backend.BF16_FLOAT_LAYERS)
    assert "bfloat16" not in plan.linears["lm_head"].large

    ids = torch.tensor(_mixed_prompts(256)[0])
    bf16_logits, float_logits = (e.prompt_tail_logits(ids.tolist(), 40) for e in (engine, reference))
    # x and weights rounded to bf16 (8 bits of mantissa) and the outputs too, layer after layer
    assert (bf16_logits - float_logits).abs().max() < 0.05 * float_logits.abs().max()
    assert not torch.equal(bf16_logits, float_logits)  # the bf16 GEMM did run

    prompts = _mixed_prompts(256)[:8]
    expected = [greedy_generate(engine.model, p, 8) for p in prompts]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert outputs == expected

"""Decode steps recorded per batch size and replayed in C (model/backends/decode_programs.py), on the
default model: the same tokens as the layers run as usual, in every KV format; steps that are not plain
decodes, batches past the limit and layers that compute in torch run the usual path."""

import pytest

from engine.engine_config import EngineConfig
from engine.kv_dtype_config import KVDtypeConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.speculation_config import SpeculationConfig

pytestmark = pytest.mark.model

PROMPTS = [list(range(1000 + 7 * i, 1032 + 13 * i)) for i in range(10)]


def _engine(model_dir, kv_dtype: str = "auto") -> LLMEngine:
    engine = LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", backend="cpu",
                                    kv_cache_bytes=64 << 20, enable_prefix_cache=False,
                                    kv_dtype=KVDtypeConfig(kv_dtype), speculation=SpeculationConfig(mode="off")))
    if engine.backend.decode_programs is None:
        pytest.skip("the fused C decode kernels are not built here")
    return engine


def _greedy(engine: LLMEngine, prompts, max_tokens: int = 24):
    return engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


@pytest.mark.parametrize("kv_dtype", ["auto", "bfloat16", "int8"])
def test_replayed_decode_steps_give_the_usual_tokens(smollm2_dir, kv_dtype):
    engine = _engine(smollm2_dir, kv_dtype)
    programs = engine.backend.decode_programs
    replayed = [_greedy(engine, PROMPTS[:1]), _greedy(engine, PROMPTS[1:4])]
    # 24 tokens: the prefill step gives the first; of 23 decode steps one is recorded and 22 replayed (the first
    # of them beside the usual path); for 1 sequence, then for 3
    assert programs.replays == 2 * 22 and not programs.not_replayed
    assert sorted(programs._recordings) == [1, 3]
    engine.backend.decode_programs = None
    assert replayed == [_greedy(engine, PROMPTS[:1]), _greedy(engine, PROMPTS[1:4])]


def test_batches_past_the_limit_and_mixed_steps_run_the_usual_path(smollm2_dir):
    engine = _engine(smollm2_dir)
    programs = engine.backend.decode_programs
    many = PROMPTS[:programs.max_batch + 1]
    tokens = _greedy(engine, many, max_tokens=6)
    assert programs.replays == 0 and not programs._recordings  # one batch of max_batch + 1 throughout
    engine.backend.decode_programs = None
    assert tokens == _greedy(engine, many, max_tokens=6)


def test_layers_that_compute_in_torch_are_not_recorded(smollm2_dir):
    engine = _engine(smollm2_dir)
    programs, backend = engine.backend.decode_programs, engine.backend
    fused = backend.silu_and_mul
    backend.silu_and_mul = lambda gate_up: fused(gate_up) * 1.0  # a torch op between the kernels
    tokens = _greedy(engine, PROMPTS[:2], max_tokens=8)
    assert programs.replays == 0
    assert list(programs.not_replayed.values()) == [
        "torch's TensorBase.mul computes outside the recorded kernels"]
    backend.decode_programs = None
    assert tokens == _greedy(engine, PROMPTS[:2], max_tokens=8)


def test_a_recording_replays_only_on_the_caches_it_was_made_on(smollm2_dir):
    """A new KV pool (greedy_generate makes one per call) is recorded again, not replayed on old pointers."""
    from engine.generate import greedy_generate

    engine = _engine(smollm2_dir)
    model = engine.model
    first = greedy_generate(model, PROMPTS[0], 10)
    second = greedy_generate(model, PROMPTS[1], 10)
    assert engine.backend.decode_programs.replays > 0
    engine.backend.decode_programs = None
    assert [first, second] == [greedy_generate(model, PROMPTS[0], 10), greedy_generate(model, PROMPTS[1], 10)]

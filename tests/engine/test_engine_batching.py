"""The batched engine gives each request exactly what it gets alone, on every backend."""

import os
import random

import pytest

from engine.engine_config import EngineConfig
from engine.generate import greedy_generate
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.conftest import DEFAULT_BACKEND_FIRST

PAGE_SIZE = 16
TEST_DEVICE = os.environ.get("RADIXSERVE_TEST_DEVICE", "cpu")  # see tests/conftest.py


def _mixed_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """16 prompts of mixed lengths; half share a long common prefix (prefix hits)."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab_size) for _ in range(70)]
    prompts = []
    for i in range(16):
        tail = [rng.randrange(3, vocab_size) for _ in range(rng.randrange(1, 60))]
        prompts.append((shared + tail) if i % 2 == 0 else tail + shared[: rng.randrange(0, 40)])
    return prompts


def _engine(model_dir, **overrides) -> LLMEngine:
    settings = dict(model_dir=model_dir, device=TEST_DEVICE, dtype="float32", page_size=PAGE_SIZE,
                    kv_cache_bytes=None, max_num_batched_tokens=2048, max_num_seqs=64, few_rows_crossover="fixed")
    settings.update(overrides)
    if settings["kv_cache_bytes"] is None:
        settings["kv_cache_bytes"] = 64 << 20
    return LLMEngine(EngineConfig(**settings))


def _alone(engine: LLMEngine, prompts, max_tokens) -> list[list[int]]:
    return [greedy_generate(engine.model, p, max_tokens) for p in prompts]


def _run_and_check(engine: LLMEngine, prompts, expected, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    for i, (got, want) in enumerate(zip(outputs, expected)):
        assert got == want, f"request {i} diverged"
    stats = engine.stats()
    assert stats.num_admitted == stats.num_waiting == 0
    # After draining: every page is either free or held by the prefix tree.
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages
    assert stats.num_held_pages == 0


def _page_bytes(engine: LLMEngine) -> int:
    return engine.kv_pool.shape.bytes_per_page


@pytest.fixture
def tiny_dir(tiny_llama_dir):
    return tiny_llama_dir


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("batched", {}),
        ("small-budget", dict(max_num_batched_tokens=24)),
        ("no-prefix-cache", dict(enable_prefix_cache=False, max_num_batched_tokens=40)),
        ("lpm", dict(schedule="lpm", max_num_batched_tokens=64)),
        ("few-seqs", dict(max_num_seqs=3, max_num_batched_tokens=50)),
    ],
)
def test_tiny_batched_equals_alone(tiny_dir, name, overrides, backend):
    engine = _engine(tiny_dir, backend=backend, **overrides)
    prompts = _mixed_prompts(256)
    expected = _alone(engine, prompts, 12)
    _run_and_check(engine, prompts, expected, 12)
    # Second pass: prompts now hit the cache.
    _run_and_check(engine, prompts, expected, 12)
    if engine.config.enable_prefix_cache:
        assert engine.stats().num_prefix_hit_tokens > 0


def test_tiny_small_pool_forces_eviction_and_preemption(tiny_dir, backend):
    probe = _engine(tiny_dir, backend=backend)
    # Room for about three requests at once: admissions evict cache, decodes preempt.
    engine = _engine(tiny_dir, kv_cache_bytes=_page_bytes(probe) * 20, max_num_batched_tokens=64, backend=backend)
    prompts = _mixed_prompts(256, seed=1)
    expected = _alone(probe, prompts, 16)
    _run_and_check(engine, prompts, expected, 16)
    assert engine.scheduler.tree.num_evicted_pages > 0
    assert engine.scheduler.num_preemptions > 0


@pytest.mark.model
@pytest.mark.parametrize("backend", DEFAULT_BACKEND_FIRST, indirect=True)
def test_smollm2_16_requests_batched_equal_alone(smollm2_dir, backend):
    probe = _engine(smollm2_dir, backend=backend)
    prompts = _mixed_prompts(49152, seed=3)
    expected = _alone(probe, prompts, 10)
    for overrides in ({}, dict(max_num_batched_tokens=32),
                      dict(kv_cache_bytes=_page_bytes(probe) * 24, max_num_batched_tokens=64)):
        engine = _engine(smollm2_dir, backend=backend, **overrides)
        _run_and_check(engine, prompts, expected, 10)
        if "kv_cache_bytes" in overrides:  # the small pool really was short of pages
            assert engine.stats().num_evicted_pages > 0
            assert engine.stats().num_preemptions > 0


def test_refuses_request_that_can_never_fit(tiny_dir):
    from engine.errors import RequestError

    probe = _engine(tiny_dir)
    engine = _engine(tiny_dir, kv_cache_bytes=_page_bytes(probe) * 4)
    with pytest.raises(RequestError, match="pages"):
        engine.add_request("big", list(range(3, 70)), SamplingParams(max_tokens=10))
    with pytest.raises(RequestError, match="context length"):
        probe.add_request("long", [5] * 500, SamplingParams(max_tokens=100))
    with pytest.raises(RequestError, match="vocabulary"):
        probe.add_request("oov", [5, 256], SamplingParams(max_tokens=1))


@pytest.mark.parametrize("abort_after_steps", [1, 3, 12])
def test_abort_frees_every_page(tiny_dir, abort_after_steps):
    # Budget 16: a 60-token prompt needs 4 steps of prefill, so step 1/3 is mid-prefill, 12 mid-decode.
    engine = _engine(tiny_dir, max_num_batched_tokens=16, enable_prefix_cache=False)
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    engine.add_request("a", list(range(3, 63)), params)
    for _ in range(abort_after_steps):
        engine.step()
    assert engine.stats().num_free_pages < engine.stats().num_pages
    assert engine.abort("a")
    stats = engine.stats()
    assert stats.num_free_pages == stats.num_pages and stats.num_admitted == 0


def test_requests_arriving_together_compute_their_shared_prefix_once(tiny_dir):
    rng = random.Random(7)
    shared = [rng.randrange(3, 200) for _ in range(20 * PAGE_SIZE)]
    prompts = [shared + [rng.randrange(3, 200) for _ in range(10)] for _ in range(4)]
    engine = _engine(tiny_dir, max_num_batched_tokens=128)  # the shared prefix takes 3 chunks
    expected = _alone(engine, prompts, 4)
    _run_and_check(engine, prompts, expected, 4)
    # The first computes the 320 shared tokens; the other three wait for them and hit the cache.
    assert engine.scheduler.num_prefix_hit_tokens == 3 * len(shared)
    assert engine.metrics.num_prefill_tokens == len(shared) + 4 * 10

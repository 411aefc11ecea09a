"""The engine thread and its asyncio handle."""

import asyncio
import time

import pytest

from engine.async_engine import AsyncEngine
from engine.engine_config import EngineConfig
from engine.errors import RequestError
from engine.generate import greedy_generate
from engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_llama_dir, engine_device):
    handle = AsyncEngine.from_config(EngineConfig(model_dir=tiny_llama_dir, device=engine_device, dtype="float32",
                                                  kv_cache_bytes=16 << 20, max_num_batched_tokens=32))
    yield handle
    handle.shutdown()


def _wait_idle(engine: AsyncEngine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.num_admitted == 0 and stats.num_waiting == 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"engine still busy: {engine.stats()}")


def test_concurrent_streams_match_greedy_alone(engine):
    prompts = [list(range(3 + i, 40 + 3 * i)) for i in range(6)]
    expected = [greedy_generate(engine.engine.model, p, 8) for p in prompts]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    async def collect(i):
        tokens, reasons = [], []
        async for output in engine.generate(f"stream-{i}", prompts[i], params):
            tokens.extend(output.new_token_ids)
            reasons.append(output.finish_reason)
        return tokens, reasons

    async def main():
        return await asyncio.gather(*(collect(i) for i in range(len(prompts))))

    results = asyncio.run(main())
    for (tokens, reasons), want in zip(results, expected):
        assert tokens == want
        assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
    _wait_idle(engine)


def test_leaving_the_stream_aborts_and_frees_pages(engine):
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)

    async def main():
        async for _ in engine.generate("cut", list(range(3, 100)), params):
            break  # the client went away after the first token

    asyncio.run(main())
    _wait_idle(engine)
    stats = engine.stats()
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages
    assert stats.num_held_pages == 0


def test_refused_request_raises_in_the_caller(engine):
    async def main():
        async for _ in engine.generate("oov", [1, 999], SamplingParams(max_tokens=2)):
            pass

    with pytest.raises(RequestError, match="vocabulary"):
        asyncio.run(main())


def test_precompute_documents_runs_between_steps_while_streams_flow(engine):
    documents = [list(range(10, 90)), list(range(100, 180))]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    expected = greedy_generate(engine.engine.model, list(range(3, 50)), 12)

    async def stream():
        return [t async for output in engine.generate("beside-precompute", list(range(3, 50)), params)
                for t in output.new_token_ids]

    async def main():
        streamed, computed = await asyncio.gather(stream(), engine.precompute_documents(documents, "tenant"))
        again = await engine.precompute_documents(documents, "tenant")
        return streamed, computed, again

    streamed, computed, again = asyncio.run(main())
    assert streamed == expected  # the other request's outputs were delivered meanwhile
    assert computed == 160 and again == 0
    with pytest.raises(RequestError, match="empty"):
        asyncio.run(engine.precompute_documents([[5] * 70, []]))
    _wait_idle(engine)


def test_from_config_builds_the_engine_on_the_thread_that_steps_it(tiny_llama_dir, engine_device):
    # One OpenMP team for load and steps: the kernels' parallel work starts on one thread only.
    import threading

    from engine.llm_engine import LLMEngine

    built_on = []

    def build():
        built_on.append(threading.current_thread().name)
        return LLMEngine(EngineConfig(model_dir=tiny_llama_dir, device=engine_device, dtype="float32",
                                      kv_cache_bytes=8 << 20))

    handle = AsyncEngine(build)
    try:
        assert built_on == ["radixserve-engine"] and handle._thread.name == "radixserve-engine"
        assert handle.facts.vocab_size == handle.engine.vocab_size
    finally:
        handle.shutdown()


def test_a_failed_build_raises_in_the_caller_and_leaves_no_thread(tmp_path):
    import threading

    def engine_threads():
        return {t.ident for t in threading.enumerate() if t.name == "radixserve-engine"}

    before = engine_threads()
    with pytest.raises(Exception, match="no-such-model"):
        AsyncEngine.from_config(EngineConfig(model_dir=tmp_path / "no-such-model", device="cpu", dtype="float32",
                                             kv_cache_bytes=8 << 20))
    assert engine_threads() == before


def test_run_compute_runs_work_on_the_engine_thread_and_returns_or_raises(tiny_llama_dir, engine_device):
    import threading

    handle = AsyncEngine.from_config(EngineConfig(model_dir=tiny_llama_dir, device=engine_device, dtype="float32",
                                                  kv_cache_bytes=8 << 20))
    try:
        assert handle.run_compute(lambda: threading.current_thread().name) == "radixserve-engine"

        def fails():
            raise ValueError("bad work")

        with pytest.raises(ValueError, match="bad work"):
            handle.run_compute(fails)
        assert handle.run_compute(lambda: 7) == 7  # the loop went on
    finally:
        handle.shutdown()
    with pytest.raises(RuntimeError, match="stopped"):
        handle.run_compute(lambda: 1)

"""The console's view of the radix tree: a tenant's longest cached prefixes, theirs only, with pins and age."""

import asyncio
import os
import random

from engine.async_engine import AsyncEngine
from engine.cached_prefixes import PREVIEW_HEAD_TOKENS, PREVIEW_TAIL_TOKENS, largest_cached_prefixes
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

TEST_DEVICE = os.environ.get("RADIXSERVE_TEST_DEVICE", "cpu")
GREEDY = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)


def _tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(length)]


def _config(model_dir) -> EngineConfig:
    return EngineConfig(model_dir=model_dir, device=TEST_DEVICE, dtype="float32", page_size=16, kv_cache_bytes=8 << 20)


def _run(engine: LLMEngine, prompt: list[int], salt: str | None) -> None:
    request = engine.add_request(f"r{random.random()}", prompt, GREEDY, salt)
    while not request.is_finished:
        engine.step()


def test_a_tenant_sees_its_own_longest_prefixes_longest_first(tiny_llama_dir):
    engine = LLMEngine(_config(tiny_llama_dir))
    shared = _tokens(0, 64)
    _run(engine, shared + _tokens(1, 40), "a")  # 104 prompt + 2 out: 6 full pages
    _run(engine, shared + _tokens(2, 70), "a")  # branches after 4 pages: 8 full pages
    _run(engine, _tokens(3, 200), "b")
    tree, pins = engine.scheduler.tree, engine.pins

    prefixes = largest_cached_prefixes(tree, pins, "a", limit=10)
    assert [p.num_tokens for p in prefixes] == [128, 96]
    assert all(p.head_token_ids[:PREVIEW_HEAD_TOKENS] == tuple(shared[:PREVIEW_HEAD_TOKENS]) for p in prefixes)
    assert len(prefixes[0].tail_token_ids) == PREVIEW_TAIL_TOKENS
    assert prefixes[0].num_ops_since_use < prefixes[1].num_ops_since_use  # used more recently
    assert all(p.num_locking_requests == 0 and p.num_pinned_tokens == 0 for p in prefixes)
    assert [p.num_tokens for p in largest_cached_prefixes(tree, pins, "a", limit=1)] == [128]

    others = largest_cached_prefixes(tree, pins, "b", limit=10)
    assert [p.num_tokens for p in others] == [192]
    assert others[0].head_token_ids == tuple(_tokens(3, PREVIEW_HEAD_TOKENS))
    assert largest_cached_prefixes(tree, pins, None, limit=10) == []  # the unsalted tenant has nothing

    engine.pin_prefix(shared, "a", 30.0)
    pinned = largest_cached_prefixes(tree, pins, "a", limit=10)
    assert all(p.num_pinned_tokens == 64 and 0 < p.pin_seconds_left <= 30 for p in pinned)


def test_the_async_handle_reads_them_on_the_engine_thread(tiny_llama_dir):
    async def main():
        engine = AsyncEngine.from_config(_config(tiny_llama_dir))
        try:
            async for _ in engine.generate("r", _tokens(5, 40), GREEDY, "t"):
                pass
            read_at, prefixes = await engine.cached_prefixes("t", 5)
            return read_at, prefixes
        finally:
            engine.shutdown()

    read_at, prefixes = asyncio.run(main())
    assert read_at > 0 and [p.num_tokens for p in prefixes] == [32]


def test_more_prefixes_of_one_length_than_the_limit(tiny_llama_dir):
    """Equal lengths past the limit: the heap's tie-break must never compare the paths themselves."""
    engine = LLMEngine(_config(tiny_llama_dir))
    for seed in range(4):
        _run(engine, _tokens(10 + seed, 32), "a")  # 32 prompt + 2 out: 2 full pages each
    prefixes = largest_cached_prefixes(engine.scheduler.tree, engine.pins, "a", limit=2)
    assert [p.num_tokens for p in prefixes] == [32, 32]

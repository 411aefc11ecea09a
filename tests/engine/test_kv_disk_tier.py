"""The engine with a KV disk tier: restarts, evictions, salts, damage, page balance."""

import logging
import os
import random

import pytest

from cache import check_tree_invariants
from engine.engine_config import EngineConfig
from engine.kv_disk_config import KVDiskConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

PAGE_SIZE = 16
TEST_DEVICE = os.environ.get("RADIXSERVE_TEST_DEVICE", "cpu")  # see tests/conftest.py
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def _engine(model_dir, kv_disk_dir, num_pages: int = 256, policy: str = "write-through", **overrides) -> LLMEngine:
    # tiny_llama: 2 layers, 2 KV heads of 16 dims, float32 -> 4 KiB a page
    settings = dict(model_dir=model_dir, device=TEST_DEVICE, dtype="float32", page_size=PAGE_SIZE,
                    kv_cache_bytes=num_pages * 4096, kv_disk=KVDiskConfig(directory=kv_disk_dir, policy=policy))
    config = EngineConfig(**{**settings, **overrides})
    return LLMEngine(config)


def _prompt(seed: int, num_tokens: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(num_tokens)]


def _run(engine: LLMEngine, prompt: list[int], cache_salt: str | None = None, request_id: str = "r"):
    request = engine.add_request(request_id, prompt, GREEDY, cache_salt)
    while engine.has_unfinished():
        engine.step()
    return list(request.output_token_ids), request.num_cached_tokens


def _assert_pages_balance(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages
    check_tree_invariants(engine.scheduler.tree)


@pytest.fixture
def cold(tiny_llama_dir):
    """cold(prompt) -> greedy output of an engine with no tier and an empty cache."""
    engine = _engine(tiny_llama_dir, None)
    return lambda prompt: _run(engine, prompt, request_id=f"cold-{len(prompt)}-{prompt[0]}")[0]


@pytest.mark.parametrize("policy", ["write-through", "write-back"])
def test_after_a_restart_every_full_page_is_a_hit_and_the_output_is_the_cold_one(tiny_llama_dir, tmp_path, cold,
                                                                                 policy):
    prompt = _prompt(0, 150)
    first = _engine(tiny_llama_dir, tmp_path, policy=policy)
    output, num_cached = _run(first, prompt)
    assert num_cached == 0 and output == cold(prompt)
    if policy == "write-back":  # nothing written until the pool lets go of a page: make it
        first.scheduler.tree.evict(first.scheduler.tree.num_evictable_pages)
    first.close()

    again = _engine(tiny_llama_dir, tmp_path, policy=policy)
    assert again.stats().kv_disk.num_pages == (150 + 8) // PAGE_SIZE
    output, num_cached = _run(again, prompt)
    assert num_cached == (len(prompt) - 1) // PAGE_SIZE * PAGE_SIZE
    assert output == cold(prompt)
    stats = again.stats()
    assert stats.kv_disk.num_hit_tokens == num_cached == stats.num_prefix_hit_tokens
    _assert_pages_balance(again)
    again.close()


def test_salts_stay_apart_across_the_tier(tiny_llama_dir, tmp_path, cold):
    prompt = _prompt(1, 100)
    first = _engine(tiny_llama_dir, tmp_path)
    _run(first, prompt, cache_salt="tenant-a")
    first.close()

    again = _engine(tiny_llama_dir, tmp_path)
    assert _run(again, prompt, cache_salt="tenant-b", request_id="b") == (cold(prompt), 0)
    assert _run(again, prompt, cache_salt=None, request_id="none") == (cold(prompt), 0)
    assert _run(again, prompt, cache_salt="tenant-a", request_id="a") == (cold(prompt), 96)
    again.close()


def test_damaged_tier_files_are_misses_and_the_output_stays_right(tiny_llama_dir, tmp_path, cold):
    prompt = _prompt(2, 120)
    first = _engine(tiny_llama_dir, tmp_path)
    _run(first, prompt)
    first.close()
    files = sorted(first.kv_tier.tier.directory.glob("*.kvpage"))
    for index, path in enumerate(files):  # flip one byte of every page's K/V
        data = bytearray(path.read_bytes())
        data[-1 - index] ^= 0x40
        path.write_bytes(data)

    again = _engine(tiny_llama_dir, tmp_path)
    assert _run(again, prompt) == (cold(prompt), 0)
    assert again.stats().kv_disk.num_hit_tokens == 0
    _assert_pages_balance(again)
    again.close()


def test_another_model_layout_never_reads_the_pages(tiny_llama_dir, tmp_path):
    prompt = _prompt(3, 80)
    first = _engine(tiny_llama_dir, tmp_path)
    _run(first, prompt)
    first.close()
    other = _engine(tiny_llama_dir, tmp_path, page_size=32)
    assert other.kv_tier.tier.directory != first.kv_tier.tier.directory
    assert other.stats().kv_disk.num_pages == 0
    other.close()


@pytest.mark.parametrize("policy", ["write-through", "write-back"])
def test_under_pressure_evicted_prefixes_come_back_from_the_tier(tiny_llama_dir, tmp_path, cold, policy):
    # 24 pages of pool, 6 sessions of 7 pages each: every session is evicted before it returns.
    engine = _engine(tiny_llama_dir, tmp_path, num_pages=24, policy=policy)
    prompts = [_prompt(10 + i, 110) for i in range(6)]
    for round_index in range(2):
        for session, prompt in enumerate(prompts):
            output, num_cached = _run(engine, prompt, request_id=f"{round_index}-{session}")
            assert output == cold(prompt)
            if round_index == 1:
                assert num_cached == 96
            _assert_pages_balance(engine)
    assert engine.stats().kv_disk.num_hit_tokens == 6 * 96
    engine.close()


def test_an_engine_without_the_prefix_cache_has_no_tier(tiny_llama_dir, tmp_path):
    engine = _engine(tiny_llama_dir, tmp_path, enable_prefix_cache=False)
    assert engine.kv_tier is None and not any(tmp_path.iterdir())
    engine.close()


def test_an_unusable_tier_directory_leaves_the_engine_serving_without_one(tiny_llama_dir, tmp_path, cold, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    tier_logger = logging.getLogger("radixserve.kv_tier")  # its parent may not propagate (serve's logging)
    tier_logger.addHandler(caplog.handler)
    try:
        engine = _engine(tiny_llama_dir, blocked)
    finally:
        tier_logger.removeHandler(caplog.handler)
    assert engine.kv_tier is None and "KV disk tier off" in caplog.text
    prompt = _prompt(4, 40)
    assert _run(engine, prompt)[0] == cold(prompt)
    engine.close()


def test_longest_prefix_first_asks_the_tier_without_hashing_a_prompt_twice(tiny_llama_dir, tmp_path):
    """lpm admission asks the tier how much of each waiting prompt it holds every step; the answer
    stays the one hashing the whole prompt gives, also once the request's tokens have grown."""
    from cache.page_hash import ROOT_PAGE_HASH, hash_pages
    from engine.kv_source import max_source_pages

    prompt = _prompt(5, 150)
    first = _engine(tiny_llama_dir, tmp_path)
    _run(first, prompt)
    first.close()
    again = _engine(tiny_llama_dir, tmp_path, schedule="lpm")
    link = again.kv_tier
    stored = again.add_request("stored", prompt, SamplingParams(max_tokens=40, temperature=0.0))
    other = again.add_request("other", _prompt(6, 150), GREEDY)
    assert link.num_suppliable_tokens(stored, 0) == link.num_suppliable_tokens(stored, 0) == 144  # 9 full pages
    assert link.num_suppliable_tokens(other, 0) == 0
    while again.has_unfinished():
        again.step()
    assert stored.num_cached_tokens == 144
    num_pages = max_source_pages(stored, PAGE_SIZE)  # its 40 outputs added pages: hashed on from the 9th
    assert num_pages > 9 and link._request_page_hashes(stored, num_pages) == hash_pages(
        ROOT_PAGE_HASH, stored.all_token_ids[: num_pages * PAGE_SIZE], PAGE_SIZE, None)
    again.close()

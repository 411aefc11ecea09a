"""The engine with quantized KV (--kv-dtype): capacity in the same bytes, the disk tier keyed by the
format, page balance, and answers close to float32's."""

import random

import pytest
import torch

from cache import check_tree_invariants
from engine.document_reuse_config import DocumentReuseConfig
from engine.engine_config import EngineConfig
from engine.kv_disk_config import KVDiskConfig
from engine.kv_dtype_config import KVDtypeConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

PAGE_SIZE = 16
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
POOL_BYTES = 32 * 8192  # tiny_llama: 2 layers, 2 KV heads of 16 dims -> 8 KiB a float32 page of 16 tokens


def _engine(model_dir, kv_disk_dir=None, kv_dtype="int8", **overrides) -> LLMEngine:
    settings = dict(model_dir=model_dir, device="cpu", dtype="float32", page_size=PAGE_SIZE,
                    kv_cache_bytes=POOL_BYTES, kv_disk=KVDiskConfig(directory=kv_disk_dir),
                    kv_dtype=KVDtypeConfig(kv_dtype))
    return LLMEngine(EngineConfig(**{**settings, **overrides}))


def _prompt(seed: int, num_tokens: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(num_tokens)]


def _run(engine: LLMEngine, prompt: list[int], request_id: str = "r"):
    request = engine.add_request(request_id, prompt, GREEDY)
    while engine.has_unfinished():
        engine.step()
    return list(request.output_token_ids), request.num_cached_tokens


def _assert_pages_balance(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages
    check_tree_invariants(engine.scheduler.tree)


def test_the_same_bytes_hold_more_tokens_and_the_metrics_say_how_many(tiny_llama_dir):
    capacities = {}
    for kv_dtype in ("float32", "bfloat16", "int8"):
        engine = _engine(tiny_llama_dir, kv_dtype=kv_dtype)
        capacities[kv_dtype] = engine.stats().num_kv_cache_tokens
        assert capacities[kv_dtype] == engine.kv_pool.num_pages * PAGE_SIZE
        assert engine.kv_pool.num_bytes <= POOL_BYTES
        engine.close()
    # int8: 16 values + a 4-byte scale per (token, head) against float32's 64 bytes: 102 pages of 2560 bytes
    assert capacities == {"float32": 32 * PAGE_SIZE, "bfloat16": 64 * PAGE_SIZE, "int8": 102 * PAGE_SIZE}


def test_k_and_v_formats_apart():
    config = KVDtypeConfig("int8", kv_dtype_v="bfloat16")
    assert config.resolve("float32") == ("int8", "bfloat16")
    assert KVDtypeConfig().resolve("bfloat16") == ("bfloat16", "bfloat16")
    with pytest.raises(ValueError):
        KVDtypeConfig("int4")


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int8"])
def test_cached_prefixes_give_the_cold_answer_and_pages_balance(tiny_llama_dir, kv_dtype):
    """A prefix read back from quantized pages answers as the same format computed cold; the greedy
    answer of the tiny model stays float32's on most tokens."""
    engine = _engine(tiny_llama_dir, kv_dtype=kv_dtype)
    prompt = _prompt(1, 90)
    cold, _ = _run(engine, prompt, "a")
    again, num_cached = _run(engine, prompt, "b")
    assert num_cached == 80 and again == cold
    _assert_pages_balance(engine)
    engine.close()


def test_a_tier_written_in_one_format_is_a_miss_for_another(tiny_llama_dir, tmp_path):
    prompt = _prompt(3, 80)
    first = _engine(tiny_llama_dir, tmp_path, kv_dtype="int8")
    output, _ = _run(first, prompt)
    first.kv_tier.tier.flush()
    first.close()
    for kv_dtype in ("float32", "bfloat16"):
        other = _engine(tiny_llama_dir, tmp_path, kv_dtype=kv_dtype)
        assert other.kv_tier.tier.directory != first.kv_tier.tier.directory
        _, num_cached = _run(other, prompt)
        assert num_cached == 0 and other.stats().kv_disk.num_hit_tokens == 0
        other.close()
    again = _engine(tiny_llama_dir, tmp_path, kv_dtype="int8")  # the same format: every full page a hit
    again_output, num_cached = _run(again, prompt)
    assert num_cached == 64 and again.stats().kv_disk.num_hit_tokens == 64 and again_output == output
    _assert_pages_balance(again)
    again.close()


def test_document_spans_are_stored_in_the_format_and_come_back_from_disk_bit_for_bit(tiny_llama_dir, tmp_path):
    """The document store keeps int8 K/V and scales; its disk copy gives them back after a restart; placing
    a span (K dequantized, re-rotated, quantized again) lets a prompt reuse it; references balance."""
    from engine.request_options import RequestOptions

    doc, system, question = _prompt(5, 48), _prompt(6, 12), _prompt(7, 8)
    settings = dict(documents=DocumentReuseConfig(enabled=True, min_span_tokens=16, boundary_tokens=4),
                    kv_cache_bytes=4 << 20)
    first = _engine(tiny_llama_dir, tmp_path, **settings)
    first.precompute_documents([doc])
    [entry] = list(first.document_store.entries())
    k, v = entry.kv
    assert (k.kv_dtype, k.values.dtype, tuple(k.scales.shape)) == ("int8", torch.int8, (2, 48, 2))
    assert entry.num_bytes == k.num_bytes + v.num_bytes == 2 * 2 * 48 * 2 * (16 + 4)
    first.close()

    again = _engine(tiny_llama_dir, tmp_path, **settings)
    prompt = system + doc + question
    options = RequestOptions(document_reuse=True, document_spans=((len(system), len(system) + len(doc)),))
    request = again.add_request("r", prompt, GREEDY, None, options)
    while again.has_unfinished():
        again.step()
    assert request.num_reused_document_tokens == len(doc) - 4
    [loaded] = list(again.document_store.entries())
    for stored, read in zip(entry.kv, loaded.kv):
        assert torch.equal(stored.values, read.values) and torch.equal(stored.scales, read.scales)
    assert all(e.ref_count == 0 for e in again.document_store.entries())
    _assert_pages_balance(again)
    again.close()

"""The engine with quantized KV (--kv-dtype): capacity in the same bytes, the disk tier keyed by the
format, page balance, and answers close to float32's. float8 runs on the torch backend (on the CPU here,
its reference; the cpu backend's C kernels refuse it by name), int8 and bfloat16 on the default (cpu)."""

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


def _engine(model_dir, kv_disk_dir=None, kv_dtype: str | KVDtypeConfig = "int8", **overrides) -> LLMEngine:
    """float8 anywhere in the formats: the torch backend (the cpu backend refuses it)."""
    config = kv_dtype if isinstance(kv_dtype, KVDtypeConfig) else KVDtypeConfig(kv_dtype)
    settings = dict(model_dir=model_dir, device="cpu", dtype="float32", page_size=PAGE_SIZE,
                    kv_cache_bytes=POOL_BYTES, kv_disk=KVDiskConfig(directory=kv_disk_dir), kv_dtype=config,
                    backend="torch" if "float8" in config.resolve("float32") else "auto")
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


def _assert_a_cached_prefix_answers_as_cold(engine, prompt, num_cached: int) -> None:
    """The prompt asked twice: the second reads num_cached tokens from the pool and answers as the first; pages balance."""
    cold, _ = _run(engine, prompt, "a")
    again, num_read = _run(engine, prompt, "b")
    assert num_read == num_cached and again == cold
    _assert_pages_balance(engine)


def test_the_same_bytes_hold_more_tokens_and_the_metrics_say_how_many(tiny_llama_dir):
    capacities = {}
    for kv_dtype in ("float32", "bfloat16", "int8", "float8"):
        engine = _engine(tiny_llama_dir, kv_dtype=kv_dtype)
        capacities[kv_dtype] = engine.stats().num_kv_cache_tokens
        assert capacities[kv_dtype] == engine.kv_pool.num_pages * PAGE_SIZE
        assert engine.kv_pool.num_bytes <= POOL_BYTES
        engine.close()
    # int8, float8: 16 values + a 4-byte scale per (token, head) against float32's 64 bytes: 102 pages of 2560 bytes
    assert capacities == {"float32": 32 * PAGE_SIZE, "bfloat16": 64 * PAGE_SIZE, "int8": 102 * PAGE_SIZE,
                          "float8": 102 * PAGE_SIZE}


def test_k_and_v_formats_apart():
    config = KVDtypeConfig("int8", kv_dtype_v="bfloat16")
    assert config.resolve("float32") == ("int8", "bfloat16")
    assert KVDtypeConfig().resolve("bfloat16") == ("bfloat16", "bfloat16")
    with pytest.raises(ValueError):
        KVDtypeConfig("int4")


@pytest.mark.parametrize("kv_dtype, backend", [("float8", "cpu"), ("float8", "auto")])
def test_the_cpu_backend_refuses_float8_by_name_and_says_what_to_use(tiny_llama_dir, kv_dtype, backend):
    for kv_dtypes in (dict(kv_dtype=kv_dtype), dict(kv_dtype_v=kv_dtype)):
        config = EngineConfig(model_dir=tiny_llama_dir, device="cpu", dtype="float32", backend=backend,
                              kv_dtype=KVDtypeConfig(**kv_dtypes))
        with pytest.raises(ValueError, match=r"float8 cannot be stored on backend cpu.*use --backend torch"):
            LLMEngine(config)


def test_a_cuda_device_without_fp8_is_refused_and_one_with_it_is_not(monkeypatch):
    from model.backends import check_kv_dtypes

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match=r"float8 KV needs a CUDA device with fp8 \(compute capability >= 8.9\), "
                                         r"and NVIDIA A100 is 8.0"):
        check_kv_dtypes("torch", "cuda", torch.bfloat16, "bfloat16", "float8")
    check_kv_dtypes("torch", "cuda", torch.bfloat16, "int8", "bfloat16")  # other formats run there
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_kv_dtypes("torch", "cuda", torch.bfloat16, "float8", "float8")
    check_kv_dtypes("auto", "cuda", torch.bfloat16, "float8", "float8")  # auto is torch there


def test_k_bfloat16_with_v_float8_on_the_torch_backend(tiny_llama_dir):
    """K and V set apart: the pool holds K in bfloat16 and V in float8 (with scales), a cached prefix
    gives the cold answer, pages balance."""
    engine = _engine(tiny_llama_dir, kv_dtype=KVDtypeConfig("bfloat16", kv_dtype_v="float8"))
    assert engine.backend.name == "torch"
    k_pages, v_pages = engine.kv_pool.layers[0]
    assert (k_pages.values.dtype, k_pages.scales) == (torch.bfloat16, None)
    assert v_pages.values.dtype == torch.float8_e4m3fn and v_pages.scales is not None
    assert engine.kv_pool.shape.kv_dtype_label == "K bfloat16, V float8"
    # per (token, head): K 16 x 2 bytes, V 16 + 4 bytes, against float32's 2 x 64: 78 pages of 3328 bytes
    assert engine.stats().num_kv_cache_tokens == 78 * PAGE_SIZE
    _assert_a_cached_prefix_answers_as_cold(engine, _prompt(2, 70), num_cached=64)
    engine.close()


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int8", "float8"])
def test_cached_prefixes_give_the_cold_answer_and_pages_balance(tiny_llama_dir, kv_dtype):
    """A prefix read back from quantized pages answers as the same format computed cold; the greedy
    answer of the tiny model stays float32's on most tokens."""
    engine = _engine(tiny_llama_dir, kv_dtype=kv_dtype)
    _assert_a_cached_prefix_answers_as_cold(engine, _prompt(1, 90), num_cached=80)
    engine.close()


@pytest.mark.parametrize("kv_dtype, others", [("int8", ("float32", "bfloat16")),
                                               ("float8", ("int8", KVDtypeConfig("float8", kv_dtype_k="bfloat16")))])
def test_a_tier_written_in_one_format_is_a_miss_for_another(tiny_llama_dir, tmp_path, kv_dtype, others):
    """float8 (torch backend) tiers too: another format, or K apart, is another directory and a miss;
    the same format loads every full page back (byte for byte: float8 planes are copied as bytes)."""
    prompt = _prompt(3, 80)
    first = _engine(tiny_llama_dir, tmp_path, kv_dtype=kv_dtype)
    output, _ = _run(first, prompt)
    first.kv_tier.tier.flush()
    first.close()
    for kv_dtype_other in others:
        other = _engine(tiny_llama_dir, tmp_path, kv_dtype=kv_dtype_other)
        assert other.kv_tier.tier.directory != first.kv_tier.tier.directory
        _, num_cached = _run(other, prompt)
        assert num_cached == 0 and other.stats().kv_disk.num_hit_tokens == 0
        other.close()
    again = _engine(tiny_llama_dir, tmp_path, kv_dtype=kv_dtype)  # the same format: every full page a hit
    again_output, num_cached = _run(again, prompt)
    assert num_cached == 64 and again.stats().kv_disk.num_hit_tokens == 64 and again_output == output
    _assert_pages_balance(again)
    again.close()


@pytest.mark.parametrize("kv_dtype, value_dtype", [("int8", torch.int8), ("float8", torch.float8_e4m3fn)])
def test_document_spans_are_stored_in_the_format_and_come_back_from_disk_bit_for_bit(tiny_llama_dir, tmp_path,
                                                                                      kv_dtype, value_dtype):
    """The document store keeps int8 (float8) K/V and scales; its disk copy gives them back after a restart;
    placing a span (K dequantized, re-rotated, quantized again) lets a prompt reuse it; references balance."""
    from engine.request_options import RequestOptions

    doc, system, question = _prompt(5, 48), _prompt(6, 12), _prompt(7, 8)
    settings = dict(documents=DocumentReuseConfig(enabled=True, min_span_tokens=16, boundary_tokens=4),
                    kv_cache_bytes=4 << 20)
    first = _engine(tiny_llama_dir, tmp_path, kv_dtype, **settings)
    first.precompute_documents([doc])
    [entry] = list(first.document_store.entries())
    k, v = entry.kv
    assert (k.kv_dtype, k.values.dtype, tuple(k.scales.shape)) == (kv_dtype, value_dtype, (2, 48, 2))
    assert entry.num_bytes == k.num_bytes + v.num_bytes == 2 * 2 * 48 * 2 * (16 + 4)
    first.close()

    again = _engine(tiny_llama_dir, tmp_path, kv_dtype, **settings)
    prompt = system + doc + question
    options = RequestOptions(document_reuse=True, document_spans=((len(system), len(system) + len(doc)),))
    request = again.add_request("r", prompt, GREEDY, None, options)
    while again.has_unfinished():
        again.step()
    assert request.num_reused_document_tokens == len(doc) - 4
    [loaded] = list(again.document_store.entries())
    for stored, read in zip(entry.kv, loaded.kv):
        assert read.values.dtype == value_dtype  # compared as bytes: torch.equal has no float8 kernel
        assert torch.equal(stored.values.view(torch.uint8), read.values.view(torch.uint8))
        assert torch.equal(stored.scales, read.scales)
    assert all(e.ref_count == 0 for e in again.document_store.entries())
    _assert_pages_balance(again)
    again.close()

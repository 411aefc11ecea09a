"""The KV pool's size: --kv-cache-memory when given (bytes or a fraction of free memory), else a few full
contexts, never more than a quarter of free memory."""

from pathlib import Path

import torch

from engine import engine_config
from engine.engine_config import DEFAULT_KV_CACHE_CONTEXTS, EngineConfig, kv_pool_bytes

CPU = torch.device("cpu")
BYTES_PER_TOKEN = 46080  # SmolLM2-135M in float32: 2 x 30 layers x 3 KV heads x 64 x 4 bytes


def test_by_default_the_pool_holds_a_few_full_contexts(monkeypatch):
    monkeypatch.setattr(engine_config, "available_memory_bytes", lambda device: 20 << 30)
    num_bytes, reason = kv_pool_bytes(EngineConfig(model_dir=Path("m")), BYTES_PER_TOKEN, 8192, CPU)
    assert num_bytes == DEFAULT_KV_CACHE_CONTEXTS * 8192 * BYTES_PER_TOKEN  # 1.4 GiB, not a quarter of 20 GiB
    assert reason == f"default: {DEFAULT_KV_CACHE_CONTEXTS} contexts of 8192 tokens"


def test_the_default_never_takes_more_than_a_quarter_of_free_memory(monkeypatch):
    monkeypatch.setattr(engine_config, "available_memory_bytes", lambda device: 4 << 30)
    num_bytes, reason = kv_pool_bytes(EngineConfig(model_dir=Path("m")), 256 << 10, 131072, CPU)
    assert num_bytes == 1 << 30 and "would be more than 0.25 of free memory" in reason


def test_kv_cache_memory_still_sets_it(monkeypatch):
    monkeypatch.setattr(engine_config, "available_memory_bytes", lambda device: 20 << 30)
    assert kv_pool_bytes(EngineConfig(model_dir=Path("m"), kv_cache_bytes=512 << 20), BYTES_PER_TOKEN, 8192, CPU) \
        == (512 << 20, "--kv-cache-memory")
    num_bytes, _ = kv_pool_bytes(EngineConfig(model_dir=Path("m"), kv_cache_fraction=0.5), BYTES_PER_TOKEN, 8192, CPU)
    assert num_bytes == 10 << 30

"""The engine's eviction policy is chosen by its config (serve --eviction-policy)."""

from pathlib import Path

import pytest

from cache import LFUPolicy, LRUPolicy
from engine.engine_config import EngineConfig
from engine.scheduler import Scheduler


@pytest.mark.parametrize("name, policy_class", [("lru", LRUPolicy), ("lfu", LFUPolicy)])
def test_the_tree_evicts_by_the_configured_policy(name, policy_class):
    config = EngineConfig(model_dir=Path("unused"), eviction_policy=name, max_num_batched_tokens=64)
    scheduler = Scheduler(config, num_pages=8, max_model_len=64)
    assert type(scheduler.tree.eviction_policy) is policy_class


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="eviction_policy"):
        EngineConfig(model_dir=Path("unused"), eviction_policy="mru")

"""LLMEngine.prompt_tail_logits: the logits of a prompt's last rows equal a plain forward pass's,
through chunked prefill and with the prefix cache on (a cached prefix is used, the tail is not)."""

import os
import random

import pytest
import torch

from engine.engine_config import EngineConfig
from engine.errors import RequestError
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

TEST_DEVICE = os.environ.get("RADIXSERVE_TEST_DEVICE", "cpu")
PROMPT_LEN = 90


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    rng = random.Random(5)
    return [rng.randrange(3, 256) for _ in range(PROMPT_LEN)]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, prompt) -> torch.Tensor:
    """(PROMPT_LEN, V) logits of a full forward pass of transformers."""
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].float()


def _engine(model_dir, max_num_batched_tokens: int) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device=TEST_DEVICE, dtype="float32", page_size=16,
                                  kv_cache_bytes=16 << 20, max_num_batched_tokens=max_num_batched_tokens,
                                  max_num_seqs=8))


@pytest.mark.parametrize("max_num_batched_tokens, num_rows", [(2048, 1), (2048, 17), (32, 40), (32, PROMPT_LEN)])
def test_tail_logits_match_a_full_forward_pass(tiny_llama_dir, prompt, reference, max_num_batched_tokens, num_rows):
    engine = _engine(tiny_llama_dir, max_num_batched_tokens)
    logits = engine.prompt_tail_logits(prompt, num_rows)
    assert logits.shape == (num_rows, reference.shape[1]) and logits.dtype == torch.float32
    assert torch.allclose(logits, reference[PROMPT_LEN - num_rows:], atol=1e-4)
    stats = engine.stats()
    assert stats.num_admitted == 0 and stats.num_free_pages + stats.num_cached_pages == stats.num_pages


def test_tail_logits_use_the_prefix_cache_but_never_for_the_tail(tiny_llama_dir, prompt, reference):
    engine = _engine(tiny_llama_dir, 2048)
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))  # the prompt is now cached
    num_prefill_before = engine.metrics.num_prefill_tokens
    logits = engine.prompt_tail_logits(prompt, 20)
    # pages below position 70 come from the tree (64 tokens), the rest is computed
    assert engine.metrics.num_prefill_tokens - num_prefill_before == PROMPT_LEN - 64
    assert torch.allclose(logits, reference[PROMPT_LEN - 20:], atol=1e-4)


def test_tail_logits_refuse_a_bad_row_count(tiny_llama_dir, prompt):
    engine = _engine(tiny_llama_dir, 2048)
    for num_rows in (0, PROMPT_LEN + 1):
        with pytest.raises(RequestError, match="num_rows"):
            engine.prompt_tail_logits(prompt, num_rows)

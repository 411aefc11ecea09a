"""Prompt logprobs (SamplingParams.prompt_logprobs): each prompt token scored by the logits of
the rows before it, as a full forward pass of transformers scores it; chunked prefill, a
cached prefix and a preemption give the same values."""

import os
import random

import pytest
import torch

from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.errors import RequestError

TEST_DEVICE = os.environ.get("RADIXSERVE_TEST_DEVICE", "cpu")
PROMPT_LEN = 100
TOP_K = 3


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    rng = random.Random(1)
    return [rng.randrange(3, 256) for _ in range(PROMPT_LEN)]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, prompt) -> torch.Tensor:
    """(PROMPT_LEN - 1,) transformers' logprob of each prompt token after the first."""
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        logprobs = model(torch.tensor([prompt])).logits[0].log_softmax(dim=-1)  # (T, V)
    return logprobs[:-1].gather(1, torch.tensor(prompt[1:]).unsqueeze(1)).squeeze(1)


def _engine(model_dir, max_num_batched_tokens: int) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device=TEST_DEVICE, dtype="float32", page_size=16,
                                  kv_cache_bytes=16 << 20, max_num_batched_tokens=max_num_batched_tokens,
                                  max_num_seqs=8))


def _first_output(engine: LLMEngine, request_id: str, prompt, params):
    engine.add_request(request_id, prompt, params)
    first = None
    while engine.has_unfinished():
        for output in engine.step():
            if output.request_id == request_id and first is None:
                first = output
    return first


@pytest.mark.parametrize("max_num_batched_tokens", [2048, 32])  # one chunk; four chunks
def test_prompt_logprobs_match_a_full_forward_pass(tiny_llama_dir, prompt, reference, max_num_batched_tokens):
    engine = _engine(tiny_llama_dir, max_num_batched_tokens)
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=TOP_K)
    output = _first_output(engine, "a", prompt, params)
    assert output.prompt_logprobs[0] is None and output.prompt_top_logprobs[0] is None
    assert len(output.prompt_logprobs) == len(output.prompt_top_logprobs) == PROMPT_LEN
    assert torch.allclose(torch.tensor(output.prompt_logprobs[1:]), reference, atol=1e-4)
    for token_id, logprob, top in zip(prompt[1:], output.prompt_logprobs[1:], output.prompt_top_logprobs[1:]):
        assert len(top) == TOP_K and [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert top[0][1] >= logprob - 1e-6
        if token_id in dict(top):
            assert dict(top)[token_id] == pytest.approx(logprob, abs=1e-6)


def test_a_cached_prefix_is_computed_again_for_prompt_logprobs(tiny_llama_dir, prompt, reference):
    engine = _engine(tiny_llama_dir, 2048)
    plain = _first_output(engine, "warm", prompt, SamplingParams(max_tokens=1, temperature=0.0))
    assert plain.prompt_logprobs is None
    again = _first_output(engine, "cached", prompt, SamplingParams(max_tokens=1, temperature=0.0))
    assert again.num_cached_tokens > 0  # the prompt is in the tree
    scored = _first_output(engine, "scored", prompt, SamplingParams(max_tokens=1, temperature=0.0,
                                                                   prompt_logprobs=0))
    assert scored.num_cached_tokens == 0
    assert torch.allclose(torch.tensor(scored.prompt_logprobs[1:]), reference, atol=1e-4)
    assert all(top == [] for top in scored.prompt_top_logprobs[1:])
    stats = engine.stats()
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages


def test_only_the_first_output_carries_prompt_logprobs(tiny_llama_dir, prompt):
    engine = _engine(tiny_llama_dir, 2048)
    engine.add_request("r", prompt[:20], SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=1))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert outputs[0].prompt_logprobs is not None and len(outputs[0].prompt_logprobs) == 20
    assert all(o.prompt_logprobs is None for o in outputs[1:])


@pytest.mark.parametrize("value", [-1, 21, 1.5, True])
def test_prompt_logprobs_out_of_range_are_refused(value):
    with pytest.raises(RequestError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)


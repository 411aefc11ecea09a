"""CacheBlend-style selective recompute (engine/selective_recompute.py): the selection on constructed
tensors, and on the tiny model: r = 1 is full prefill, r > 0 recomputes round(r * placed) tokens, pages
and store references balance whatever happens mid-way."""

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine.document_reuse_config import DocumentReuseConfig
from engine.engine_config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.selective_recompute import most_deviating, split_runs
from tests.engine.test_document_reuse import (DOC_LEN, DOCS, OFF, OTHER_SYSTEM, QUESTION_LEN, REUSE, SYSTEM,
                                              _assert_drained, _engine, _forget_tree, _prompt, _run, _tokens, run_random_mixes)


def test_most_deviating_picks_the_rows_whose_k_and_v_moved_most():
    torch.manual_seed(0)
    k_placed, v_placed = torch.randn(10, 2, 4), torch.randn(10, 2, 4)
    k_fresh, v_fresh = k_placed.clone(), v_placed.clone()
    # row -> how far it moved: K only, V only, both, across heads
    k_fresh[7, 0] += 3.0  # norm 6
    v_fresh[2, 1] += 2.0  # norm 4
    k_fresh[5] += 0.5  # norm 0.5 * sqrt(8) ~ 1.41
    v_fresh[5] += 0.5  # with K: 2.0
    k_fresh[0, 1, 0] += 1.0  # norm 1
    assert most_deviating(k_placed, v_placed, k_fresh, v_fresh, 1).tolist() == [7]
    assert most_deviating(k_placed, v_placed, k_fresh, v_fresh, 3).tolist() == [2, 5, 7]  # ascending
    assert most_deviating(k_placed, v_placed, k_fresh, v_fresh, 4).tolist() == [0, 2, 5, 7]
    assert most_deviating(k_placed, v_placed, k_fresh, v_fresh, 0).tolist() == []
    assert sorted(most_deviating(k_placed, v_placed, k_fresh, v_fresh, 10).tolist()) == list(range(10))


def test_split_runs_takes_the_chosen_positions_out():
    runs = [(10, 20), (30, 35)]
    assert split_runs(runs, []) == runs
    assert split_runs(runs, [10, 11, 15, 19, 32]) == [(12, 15), (16, 19), (30, 32), (33, 35)]
    assert split_runs(runs, list(range(10, 20)) + list(range(30, 35))) == []
    assert split_runs([(0, 3)], [1]) == [(0, 1), (2, 3)]


@pytest.mark.parametrize("fraction", [-0.1, 1.5, math.nan, math.inf])
def test_the_fraction_must_lie_in_zero_one(fraction):
    with pytest.raises(ValueError, match=r"document recompute fraction must be in \[0, 1\]"):
        EngineConfig(model_dir=Path("m"), documents=DocumentReuseConfig(recompute_fraction=fraction))


def test_fractions_in_zero_one_are_accepted():
    for fraction in (0.0, 0.15, 1.0):
        assert EngineConfig(model_dir=Path("m"), documents=DocumentReuseConfig(recompute_fraction=fraction)).documents.recompute_fraction \
            == fraction


@pytest.mark.parametrize("max_num_batched_tokens", [2048, 24])  # ranges in one step; across steps
def test_recomputing_everything_placed_equals_reuse_off(tiny_llama_dir, backend, max_num_batched_tokens):
    engine = _engine(tiny_llama_dir, backend=backend, max_num_batched_tokens=max_num_batched_tokens, documents=replace(REUSE, recompute_fraction=1.0))
    reference = _engine(tiny_llama_dir, backend=backend, documents=replace(REUSE, enabled=False))
    _run(engine, *_prompt(SYSTEM, "ABC"))  # stores A, B, C
    prompt, options = _prompt(OTHER_SYSTEM, "CAB")
    num_prefill_before = engine.metrics.num_prefill_tokens
    got, first = _run(engine, prompt, options, max_tokens=8)
    assert got == _run(reference, prompt, OFF, max_tokens=8)[0]
    assert first.num_reused_document_tokens == 0 and first.num_cached_tokens == 0
    assert engine.metrics.num_prefill_tokens - num_prefill_before == len(prompt)
    stats = engine.stats()
    assert stats.documents.num_reused_tokens == 0
    assert stats.documents.num_selective_recomputed_tokens == 3 * DOC_LEN - 2 * 4  # all that was placed
    _forget_tree(engine)
    torch.testing.assert_close(engine.prompt_tail_logits(prompt, QUESTION_LEN, options=options),
                               reference.prompt_tail_logits(prompt, QUESTION_LEN), atol=1e-5, rtol=1e-5)
    _assert_drained(engine)


@pytest.mark.parametrize("fraction", [0.15, 0.5])
def test_a_fraction_recomputes_that_share_of_the_placed_tokens(tiny_llama_dir, fraction):
    engine = _engine(tiny_llama_dir, documents=replace(REUSE, recompute_fraction=fraction))
    _run(engine, *_prompt(SYSTEM, "ABC"))
    prompt, options = _prompt(OTHER_SYSTEM, "CAB")
    num_placed = 3 * DOC_LEN - 2 * 4  # as without selective recompute: B follows A, C and A recompute 4 each
    num_chosen = round(fraction * num_placed)
    num_prefill_before, probed_before = engine.metrics.num_prefill_tokens, engine.stats().documents.num_probe_tokens
    _, first = _run(engine, prompt, options, max_tokens=1)
    assert first.num_reused_document_tokens == num_placed - num_chosen
    assert first.num_cached_tokens == num_placed - num_chosen
    assert engine.metrics.num_prefill_tokens - num_prefill_before == len(prompt) - num_placed + num_chosen
    stats = engine.stats()
    assert stats.documents.num_selective_recomputed_tokens == num_chosen
    assert stats.documents.num_recomputed_tokens == 8 + num_chosen
    assert stats.documents.num_reused_tokens == num_placed - num_chosen
    # the probe ran from the end of the new system prompt's matched pages (none) to the end of B
    assert stats.documents.num_probe_tokens - probed_before == len(OTHER_SYSTEM) + 3 * DOC_LEN
    _assert_drained(engine)


def test_scattered_recomputed_tokens_give_the_same_logits_in_one_step_or_many(tiny_llama_dir, backend):
    """The chosen tokens form many short ranges: run in one step or cut across steps by a small budget,
    each attends to the same KV, so the logits agree (and differ from plain reuse)."""
    logits = {}
    for budget, fraction in ((2048, 0.3), (24, 0.3), (2048, 0.0)):
        engine = _engine(tiny_llama_dir, backend=backend, max_num_batched_tokens=budget, documents=replace(REUSE, recompute_fraction=fraction))
        _run(engine, *_prompt(SYSTEM, "ABC"))
        _forget_tree(engine)
        prompt, options = _prompt(OTHER_SYSTEM, "CAB")
        logits[budget, fraction] = engine.prompt_tail_logits(prompt, QUESTION_LEN, options=options)
        _assert_drained(engine)
    torch.testing.assert_close(logits[24, 0.3], logits[2048, 0.3], atol=1e-5, rtol=1e-5)
    assert (logits[2048, 0.3] - logits[2048, 0.0]).abs().max() > 1e-4


def test_the_recomputed_tokens_are_the_most_deviating(tiny_llama_dir, monkeypatch):
    """The engine asks most_deviating once per probed request, about every placed token's layer-1 K/V
    as placed and as the probe left it (which differ: the span moved), for round(r * placed) rows."""
    import engine.selective_recompute as selective

    calls = []

    def spy(k_placed, v_placed, k_fresh, v_fresh, num_chosen):
        rows = most_deviating(k_placed, v_placed, k_fresh, v_fresh, num_chosen)
        calls.append((k_placed.shape[0], num_chosen, (k_fresh - k_placed).abs().amax().item(), rows.tolist()))
        return rows

    monkeypatch.setattr(selective, "most_deviating", spy)
    engine = _engine(tiny_llama_dir, documents=replace(REUSE, recompute_fraction=0.2, boundary_tokens=0))
    _run(engine, *_prompt(SYSTEM, "AB"))
    assert calls == []  # nothing placed
    _run(engine, *_prompt(OTHER_SYSTEM, "BA"))
    [(num_placed, num_chosen, max_delta, rows)] = calls
    assert (num_placed, num_chosen) == (2 * DOC_LEN, 2 * DOC_LEN // 5)
    assert max_delta > 1e-3  # layer 1 of a moved span differs from what this context gives
    assert len(set(rows)) == num_chosen
    _assert_drained(engine)


def test_zero_fraction_probes_nothing(tiny_llama_dir):
    engine = _engine(tiny_llama_dir)
    assert engine.documents.selective is None
    _run(engine, *_prompt(SYSTEM, "AB"))
    _run(engine, *_prompt(OTHER_SYSTEM, "BA"))
    assert engine.stats().documents.num_probe_tokens == engine.stats().documents.num_selective_recomputed_tokens == 0


def test_abort_after_the_probe_balances_pages_and_references(tiny_llama_dir):
    """A budget of 24 tokens: the probe runs in the admission step, the chosen tokens over the next
    steps; aborting in between leaves nothing held."""
    engine = _engine(tiny_llama_dir, max_num_batched_tokens=24, documents=replace(REUSE, recompute_fraction=0.5))
    _run(engine, *_prompt(SYSTEM, "ABC"))
    prompt, options = _prompt(OTHER_SYSTEM, "CAB")
    request = engine.add_request("mid", prompt, SamplingParams(max_tokens=4, temperature=0.0), None, options)
    engine.step()
    assert engine.stats().documents.num_probe_tokens > 0 and not request.is_finished and request.stitched_runs
    assert engine.abort("mid")
    _assert_drained(engine)
    _, first = _run(engine, prompt, options)  # and the next one still reuses and recomputes
    assert 0 < first.num_reused_document_tokens < 3 * DOC_LEN
    _assert_drained(engine)


def test_preemption_and_random_mixes_balance_pages_and_references(tiny_llama_dir):
    """A small pool (preemption mid-prefill, between the probe and the chosen tokens), a small store,
    reuse on and off, two salts: after every drain pages and store references balance."""
    page_bytes = _engine(tiny_llama_dir).kv_pool.shape.bytes_per_page
    entry_bytes = 2 * 2 * DOC_LEN * 2 * 16 * 4
    engine = _engine(tiny_llama_dir, kv_cache_bytes=page_bytes * 40, max_num_batched_tokens=48, documents=replace(REUSE, store_bytes=entry_bytes * 3, recompute_fraction=0.3))
    run_random_mixes(engine, random.Random(5))
    stats = engine.stats()
    assert stats.documents.num_selective_recomputed_tokens > 0 and stats.documents.num_reused_tokens > 0
    assert stats.num_preemptions > 0


def test_precompute_then_recompute_keeps_the_counts_honest(tiny_llama_dir):
    engine = _engine(tiny_llama_dir, documents=replace(REUSE, recompute_fraction=0.25))
    engine.precompute_documents([DOCS["A"], DOCS["B"]])
    prompt, options = _prompt(SYSTEM, "BA")
    _, first = _run(engine, prompt, options)
    num_placed = 2 * (DOC_LEN - 4)
    assert first.num_reused_document_tokens == num_placed - round(0.25 * num_placed)
    _assert_drained(engine)

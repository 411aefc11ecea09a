"""Document KV reuse end to end on the tiny model: stored spans placed at any position (K re-rotated),
only what needs it computed, the radix tree kept exact, tenants kept apart, counts balanced."""

import os
import random
from dataclasses import replace

import pytest
import torch

from cache import check_tree_invariants
from engine.engine_config import EngineConfig
from engine.speculation_config import SpeculationConfig
from engine.errors import RequestError
from engine.llm_engine import LLMEngine
from engine.document_reuse_config import DocumentReuseConfig
from engine.request_options import RequestOptions
from engine.sampling_params import SamplingParams

TEST_DEVICE = os.environ.get("RADIXSERVE_TEST_DEVICE", "cpu")
DOC_LEN, SYSTEM_LEN, QUESTION_LEN = 50, 12, 10  # system and question: shorter than a span
ON, OFF = RequestOptions(document_reuse=True), RequestOptions(document_reuse=False)
REUSE = DocumentReuseConfig(enabled=True, min_span_tokens=16, boundary_tokens=4)


def _tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(length)]


DOCS = {name: _tokens(100 + i, DOC_LEN) for i, name in enumerate("ABCD")}
SYSTEM, OTHER_SYSTEM = _tokens(1, SYSTEM_LEN), _tokens(2, SYSTEM_LEN + 3)
QUESTION = _tokens(3, QUESTION_LEN)


def _prompt(system: list[int], names: str, question=QUESTION) -> tuple[list[int], RequestOptions]:
    """system + documents + question, and the documents' exact spans (reuse on)."""
    tokens, spans = list(system), []
    for name in names:
        spans.append((len(tokens), len(tokens) + DOC_LEN))
        tokens += DOCS[name]
    return tokens + question, RequestOptions(document_reuse=True, document_spans=tuple(spans))


def _engine(model_dir, **overrides) -> LLMEngine:
    settings = dict(model_dir=model_dir, device=TEST_DEVICE, dtype="float32", page_size=16, kv_cache_bytes=16 << 20,
                    max_num_batched_tokens=2048, max_num_seqs=16, documents=REUSE)
    settings.update(overrides)
    return LLMEngine(EngineConfig(**settings))


def _run(engine: LLMEngine, prompt, options, max_tokens=6, salt=None):
    """(greedy output ids, the first RequestOutput) of one request run alone."""
    request = engine.add_request(f"r{engine.num_steps}-{random.random()}", prompt,
                                 SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), salt, options)
    first = None
    while not request.is_finished:
        for output in engine.step():
            first = first or output
    return list(request.output_token_ids), first


def _assert_drained(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats.num_admitted == stats.num_waiting == 0
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages and stats.num_held_pages == 0
    assert engine.document_store.num_referenced_entries == 0
    check_tree_invariants(engine.scheduler.tree)


def _forget_tree(engine: LLMEngine) -> None:
    engine.scheduler.tree.evict(engine.scheduler.allocator.num_pages)


def run_random_mixes(engine: LLMEngine, rng: random.Random, check_each_step=lambda: True) -> None:
    """Three rounds of 8 requests at once (1-3 documents in random order, two systems, two salts,
    reuse on for 70%), each round drained, and pages and store references balanced after it."""
    for _ in range(3):
        for _ in range(8):
            names = "".join(rng.sample("ABCD", rng.randrange(1, 4)))
            prompt, options = _prompt(rng.choice([SYSTEM, OTHER_SYSTEM]), names, _tokens(rng.random(), 5))
            engine.add_request(f"mix-{rng.random()}", prompt,
                               SamplingParams(max_tokens=rng.randrange(1, 12), temperature=0.0, ignore_eos=True),
                               rng.choice([None, "t"]), options if rng.random() < 0.7 else OFF)
        while engine.has_unfinished():
            engine.step()
            assert check_each_step()
        _assert_drained(engine)


def test_zero_delta_reuse_equals_ordinary_prefill(tiny_llama_dir):
    """Spans stored from a prompt, placed back at the same positions (delta 0, k = 0): the same KV,
    the same logits, and the request computes only the question."""
    engine = _engine(tiny_llama_dir, documents=replace(REUSE, boundary_tokens=0))
    prompt, options = _prompt(SYSTEM, "AB")
    exact = engine.prompt_tail_logits(prompt, QUESTION_LEN, options=options)  # stores A and B
    assert engine.stats().documents.num_store_entries == 2
    _forget_tree(engine)  # only the store can help now
    num_prefill_before = engine.metrics.num_prefill_tokens
    stitched = engine.prompt_tail_logits(prompt, QUESTION_LEN, options=options)
    assert engine.metrics.num_prefill_tokens - num_prefill_before == len(prompt) - 2 * DOC_LEN
    assert engine.stats().documents.num_reused_tokens == 2 * DOC_LEN
    torch.testing.assert_close(stitched, exact, atol=1e-5, rtol=1e-5)
    _assert_drained(engine)


def test_full_recompute_equals_ordinary_prefill(tiny_llama_dir):
    """k >= the span's length: nothing is placed, everything is computed."""
    engine = _engine(tiny_llama_dir, documents=replace(REUSE, boundary_tokens=DOC_LEN))
    reference = _engine(tiny_llama_dir, documents=replace(REUSE, enabled=False))
    engine.prompt_tail_logits(*_prompt(SYSTEM, "AB")[:1], 1, options=_prompt(SYSTEM, "AB")[1])
    prompt, options = _prompt(OTHER_SYSTEM, "BA")
    logits = engine.prompt_tail_logits(prompt, QUESTION_LEN, options=options)
    assert engine.stats().documents.num_reused_tokens == 0
    torch.testing.assert_close(logits, reference.prompt_tail_logits(prompt, QUESTION_LEN), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("max_num_batched_tokens", [2048, 24])  # all ranges in one step; ranges across steps
def test_moved_documents_are_reused_and_stay_close_to_exact(tiny_llama_dir, backend, max_num_batched_tokens):
    engine = _engine(tiny_llama_dir, backend=backend, max_num_batched_tokens=max_num_batched_tokens)
    reference = _engine(tiny_llama_dir, backend=backend, documents=replace(REUSE, enabled=False))
    _run(engine, *_prompt(SYSTEM, "ABC"))
    prompt, options = _prompt(OTHER_SYSTEM, "CAB")  # every document at a new position, after other text
    num_prefill_before = engine.metrics.num_prefill_tokens
    _, first = _run(engine, prompt, options, max_tokens=1)
    # B follows A as when it was computed: no boundary recompute; C and A recompute k = 4 tokens each
    num_reused = 3 * DOC_LEN - 2 * 4
    assert first.num_reused_document_tokens == num_reused
    assert first.num_cached_tokens == num_reused  # nothing of the new system prompt is cached
    assert engine.metrics.num_prefill_tokens - num_prefill_before == len(prompt) - num_reused
    stats = engine.stats()
    assert (stats.documents.num_reused_spans, stats.documents.num_recomputed_tokens) == (3, 8)
    _forget_tree(engine)
    stitched = engine.prompt_tail_logits(prompt, 1, options=options)[0]
    exact = reference.prompt_tail_logits(prompt, 1)[0]
    kl = torch.nn.functional.kl_div(stitched.log_softmax(-1), exact.log_softmax(-1), log_target=True,
                                    reduction="sum")
    assert kl < 0.05, f"first-token KL {kl:.4f}"
    _assert_drained(engine)


def test_reuse_off_never_gets_derived_kv(tiny_llama_dir):
    engine = _engine(tiny_llama_dir)
    reference = _engine(tiny_llama_dir, documents=replace(REUSE, enabled=False))
    _run(engine, *_prompt(SYSTEM, "AB"))
    moved, options = _prompt(OTHER_SYSTEM, "BA")
    _run(engine, moved, options)  # stitched: its derived pages are cached under the derived key
    assert engine.stats().documents.num_reused_tokens > 0
    # (prompt, its exact-key hit): the page before the first placed position (15 + k = 19); then what
    # moved + [7, 8, 9] just computed exactly; the first request's prompt, computed exactly (7 pages)
    for prompt, num_cached in ((moved + [7, 8, 9], 16), (moved, len(moved) // 16 * 16),
                               (_prompt(SYSTEM, "AB")[0], 112)):
        want, _ = _run(reference, prompt, OFF)
        got, first = _run(engine, prompt, OFF)
        assert got == want and first.num_reused_document_tokens == 0
        assert first.num_cached_tokens == num_cached
    _assert_drained(engine)


def test_a_follow_up_with_reuse_on_gets_the_whole_stitched_prefix(tiny_llama_dir):
    engine = _engine(tiny_llama_dir)
    _run(engine, *_prompt(SYSTEM, "AB"))
    moved, options = _prompt(OTHER_SYSTEM, "BA")
    output_ids, _ = _run(engine, moved, options)
    follow_up = moved + output_ids + [11, 12, 13]
    _, first = _run(engine, follow_up, options)
    assert first.num_cached_tokens >= (len(moved) + len(output_ids)) // 16 * 16 - 16
    assert first.num_reused_document_tokens == 0  # it came from the tree's derived pages
    _assert_drained(engine)


def test_a_salted_tenant_never_receives_another_tenants_document_kv(tiny_llama_dir):
    engine = _engine(tiny_llama_dir)
    reference = _engine(tiny_llama_dir, documents=replace(REUSE, enabled=False))
    _run(engine, *_prompt(SYSTEM, "AB"), salt="tenant-a")
    moved, options = _prompt(OTHER_SYSTEM, "BA")
    got, first = _run(engine, moved, options, salt="tenant-b")
    assert first.num_reused_document_tokens == 0 and first.num_cached_tokens == 0
    assert got == _run(reference, moved, OFF)[0]
    _, first = _run(engine, moved, options, salt=None)
    assert first.num_reused_document_tokens == 0  # None is a salt too
    _forget_tree(engine)
    _, first = _run(engine, moved, options, salt="tenant-a")
    assert first.num_reused_document_tokens > 0
    _assert_drained(engine)


def test_precompute_documents_stores_spans_once(tiny_llama_dir):
    engine = _engine(tiny_llama_dir)
    docs = [DOCS["A"], DOCS["B"]]
    assert engine.precompute_documents(docs) == 2 * DOC_LEN
    assert engine.stats().documents.num_store_entries == 2
    assert engine.precompute_documents(docs) == 0  # stored: costs nothing
    assert engine.precompute_documents(docs, cache_salt="other") == 2 * DOC_LEN
    _, first = _run(engine, *_prompt(SYSTEM, "BA"))
    assert first.num_reused_document_tokens == 2 * (DOC_LEN - 4)
    _assert_drained(engine)


def test_documents_precomputed_in_context_are_stored_at_their_real_positions(tiny_llama_dir):
    """Each document computed after its context: only the document's spans are stored (the context,
    a span's length here, is not), at the position the document had; a shared context is computed
    once (the prefix cache holds it)."""
    engine = _engine(tiny_llama_dir)
    context = _tokens(5, 32)  # two full pages
    docs = [DOCS["A"], DOCS["B"]]
    assert engine.precompute_documents(docs, context_token_id_lists=[context, context]) == 32 + 2 * DOC_LEN
    entries = {entry.key[0]: entry for entry in engine.document_store.entries()}
    assert set(entries) == {tuple(DOCS["A"]), tuple(DOCS["B"])}
    assert all(entry.position == 32 for entry in entries.values())
    assert engine.precompute_documents(docs, context_token_id_lists=[context, context]) == 0  # stored
    with pytest.raises(RequestError):
        engine.precompute_documents(docs, context_token_id_lists=[context])
    _assert_drained(engine)


def test_a_prompt_with_the_precompute_context_then_the_document_reuses_it_exactly(tiny_llama_dir):
    """The document's KV was computed after exactly this prompt's prefix: placed (delta 0), it is the
    KV ordinary prefill computes, so the logits agree with reuse off."""
    engine = _engine(tiny_llama_dir)
    reference = _engine(tiny_llama_dir, documents=replace(REUSE, enabled=False))
    engine.precompute_documents([DOCS["A"]], context_token_id_lists=[SYSTEM])
    _forget_tree(engine)  # the context and the document leave the prefix cache: only the store helps
    prompt, options = _prompt(SYSTEM, "A")
    num_prefill_before = engine.metrics.num_prefill_tokens
    logits = engine.prompt_tail_logits(prompt, QUESTION_LEN, options=options)
    # the context's tokens come with the span (its lead): all of them match; k = 4 recomputed
    num_placed = SYSTEM_LEN + DOC_LEN - 4
    assert engine.stats().documents.num_reused_tokens == num_placed
    assert engine.metrics.num_prefill_tokens - num_prefill_before == len(prompt) - num_placed
    torch.testing.assert_close(logits, reference.prompt_tail_logits(prompt, QUESTION_LEN), atol=1e-5, rtol=1e-5)
    _assert_drained(engine)


def test_a_precomputed_span_places_as_much_of_its_context_tail_as_the_prompt_repeats(tiny_llama_dir):
    """The last tokens of the precompute context (the markup before a document) are kept with the
    span: a prompt with 10 of them right before the document places those 10 too (k recomputed at
    their start); one with other tokens there places the span alone."""
    engine = _engine(tiny_llama_dir)
    context = _tokens(5, 40)
    engine.precompute_documents([DOCS["A"]], context_token_id_lists=[context])
    [entry] = list(engine.document_store.entries())
    assert entry.lead_ids == tuple(context[-32:]) and entry.kv[0].shape[1] == 32 + DOC_LEN
    _forget_tree(engine)
    for before, num_lead in ((OTHER_SYSTEM + context[-10:], 10), (OTHER_SYSTEM, 0)):
        prompt = before + DOCS["A"] + QUESTION
        options = RequestOptions(document_reuse=True, document_spans=((len(before), len(before) + DOC_LEN),))
        _, first = _run(engine, prompt, options, max_tokens=1)
        assert first.num_reused_document_tokens == num_lead + DOC_LEN - 4
        _forget_tree(engine)
    _assert_drained(engine)


def test_a_span_the_tree_ends_inside_places_its_rest_from_the_store(tiny_llama_dir):
    """The tree holds whole pages only: a prompt that shares a document with an earlier one and
    diverges right after it matches the tree up to the page before the divergence, inside the span.
    The span's rest comes from the store (its rows were computed after the same tokens), so only the
    new question is computed, and the logits are those of ordinary prefill."""
    engine = _engine(tiny_llama_dir)
    reference = _engine(tiny_llama_dir, documents=replace(REUSE, enabled=False))
    prompt, options = _prompt(SYSTEM, "A")
    _run(engine, prompt, options, max_tokens=1)  # computes A and stores it
    other_question = _tokens(4, QUESTION_LEN)
    prompt, options = _prompt(SYSTEM, "A", question=other_question)
    num_tree_tokens = (SYSTEM_LEN + DOC_LEN) // 16 * 16  # 48: the span runs on to 62
    num_prefill_before = engine.metrics.num_prefill_tokens
    logits = engine.prompt_tail_logits(prompt, QUESTION_LEN, options=options)
    assert engine.metrics.num_prefill_tokens - num_prefill_before == QUESTION_LEN
    assert engine.stats().documents.num_reused_tokens == SYSTEM_LEN + DOC_LEN - num_tree_tokens
    torch.testing.assert_close(logits, reference.prompt_tail_logits(prompt, QUESTION_LEN), atol=1e-5, rtol=1e-5)
    _assert_drained(engine)


def test_random_mixes_balance_pages_and_store_references(tiny_llama_dir):
    """Many requests at once over a small pool and a small store (eviction, preemption), reuse on
    and off, two salts: after every drain pages and store references balance."""
    probe = _engine(tiny_llama_dir)
    page_bytes = probe.kv_pool.shape.bytes_per_page
    entry_bytes = 2 * 2 * DOC_LEN * 2 * 16 * 4  # K and V, 2 layers, 50 tokens, 2 KV heads of 16 floats
    engine = _engine(tiny_llama_dir, kv_cache_bytes=page_bytes * 40, max_num_batched_tokens=64,
                     documents=replace(REUSE, store_bytes=entry_bytes * 3))
    run_random_mixes(engine, random.Random(4),
                     lambda: engine.document_store.num_bytes <= engine.document_store.max_bytes)
    assert engine.stats().documents.num_reused_tokens > 0
    assert engine.scheduler.tree.num_evicted_pages > 0


def test_overlapping_document_spans_are_refused(tiny_llama_dir):
    from engine.errors import RequestError

    engine = _engine(tiny_llama_dir)
    options = RequestOptions(document_reuse=True, document_spans=((0, 30), (20, 40)))
    with pytest.raises(RequestError, match="overlaps"):
        engine.add_request("o", list(range(3, 60)), SamplingParams(max_tokens=1), None, options)


def test_speculation_over_reused_documents_keeps_the_greedy_output(tiny_llama_dir):
    """Document reuse and speculation together: the same prompts in the same order give the same
    greedy outputs with speculation on and off (drafts are verified against the stitched KV), and
    pages and store references balance after the drain."""
    repetitive = [7, 8, 9, 10] * 6  # a question whose answer the proposer can draft from
    prompts = [_prompt(SYSTEM, "AB", repetitive), _prompt(OTHER_SYSTEM, "BA", repetitive),
               _prompt(SYSTEM, "CAB", repetitive)]
    outputs = {}
    for mode in ("off", "ngram"):
        engine = _engine(tiny_llama_dir, speculation=SpeculationConfig(mode))
        outputs[mode] = [_run(engine, prompt, options, max_tokens=24)[0] for prompt, options in prompts]
        assert engine.stats().documents.num_reused_tokens > 0
        if mode == "ngram":
            assert engine.stats().speculation.num_verify_chunks > 0
        _assert_drained(engine)
    assert outputs["ngram"] == outputs["off"]


def _step_until_done(engine: LLMEngine, max_steps: int = 500) -> None:
    """Every step schedules work while requests are unfinished: no admission ever waits forever."""
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return
        num_steps = engine.num_steps
        engine.step()
        assert engine.num_steps == num_steps + 1, "a step scheduled nothing while requests were unfinished"
    raise AssertionError(f"not done after {max_steps} steps")


def test_a_request_waits_for_a_span_another_is_computing_then_reuses_it(tiny_llama_dir):
    """Two prompts with the same documents after different system prompts, added together: the
    second waits while the first computes them (stored as soon as computed), then places them,
    instead of computing them twice."""
    engine = _engine(tiny_llama_dir, max_num_batched_tokens=32)  # the first takes a few steps
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    first = engine.add_request("first", *_prompt(SYSTEM, "AB")[:1], params, options=_prompt(SYSTEM, "AB")[1])
    prompt, options = _prompt(OTHER_SYSTEM, "AB")
    second = engine.add_request("second", prompt, params, options=options)
    engine.step()
    assert first.status.value == "prefilling" and second.status.value == "waiting"
    _step_until_done(engine)
    assert second.num_reused_document_tokens == 2 * DOC_LEN - 4  # A recomputes k = 4, B follows A as stored
    assert engine.stats().documents.num_store_entries == 2
    _assert_drained(engine)


def test_waiting_for_spans_never_deadlocks_and_balances(tiny_llama_dir):
    """Many requests sharing documents in every order, a small budget, a small pool (preemption) and
    two salts: every step does work until all are done, and pages and references balance."""
    probe = _engine(tiny_llama_dir)
    engine = _engine(tiny_llama_dir, kv_cache_bytes=probe.kv_pool.shape.bytes_per_page * 40,
                     max_num_batched_tokens=48, max_num_seqs=6)
    rng = random.Random(7)
    for i in range(24):
        names = "".join(rng.sample("ABCD", rng.randrange(1, 4)))
        prompt, options = _prompt(rng.choice([SYSTEM, OTHER_SYSTEM]), names, _tokens(rng.random(), 5))
        engine.add_request(f"wait-{i}", prompt, SamplingParams(max_tokens=rng.randrange(1, 8), temperature=0.0,
                                                               ignore_eos=True),
                           rng.choice([None, "t"]), options)
    _step_until_done(engine, max_steps=2000)
    assert engine.stats().documents.num_reused_tokens > 0
    _assert_drained(engine)

"""Speculation changes speed, never outputs: greedy and seeded runs equal runs without it, sampled
runs keep their distribution, and every page comes back."""

import os
import random
from collections import Counter

import pytest
import torch

from engine.engine_config import EngineConfig
from engine.generate import greedy_generate
from engine.llm_engine import LLMEngine
from engine.request import FinishReason, Request
from engine.request_options import RequestOptions
from engine.sampler import Sampler, make_sampling_state
from engine.sampling_params import SamplingParams
from engine.speculation_config import SpeculationConfig
from engine.speculative_verify import sample_and_verify

TEST_DEVICE = os.environ.get("RADIXSERVE_TEST_DEVICE", "cpu")


def _engine(model_dir, speculative: str, max_verify_rows_per_step: int = 2048, **overrides) -> LLMEngine:
    # every request may draft however many run (the cpu backend stops drafting past 8 rows a step)
    speculation = SpeculationConfig(speculative, max_verify_rows_per_step=max_verify_rows_per_step)
    settings = dict(model_dir=model_dir, device=TEST_DEVICE, dtype="float32", page_size=16,
                    kv_cache_bytes=64 << 20, max_num_batched_tokens=2048, speculation=speculation)
    settings.update(overrides)
    return LLMEngine(EngineConfig(**settings))


def _copying_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """12 prompts whose text repeats (so drafts are found), of mixed lengths, half sharing a prefix."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab_size) for _ in range(40)]
    prompts = []
    for i in range(12):
        segment = [rng.randrange(3, vocab_size) for _ in range(rng.randrange(4, 30))]
        body = segment * rng.randrange(2, 4) + segment[:rng.randrange(1, len(segment))]
        prompts.append(shared + body if i % 2 == 0 else body)
    return prompts


def _assert_pages_balance(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats.num_admitted == stats.num_waiting == 0
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages
    assert stats.num_held_pages == 0


@pytest.mark.parametrize("mode, overrides", [
    ("ngram", {}),
    ("suffix", dict(max_num_batched_tokens=24)),  # drafts compete with prefill chunks for a small budget
    ("ngram", dict(kv_cache_bytes=None)),  # a small pool: eviction and preemption (set below)
    ("suffix", dict(enable_prefix_cache=False, max_num_batched_tokens=40)),
])
def test_greedy_outputs_equal_decoding_without_speculation(tiny_llama_dir, mode, overrides):
    _check_greedy_equal(tiny_llama_dir, "auto", mode, overrides)


def test_greedy_outputs_equal_on_every_backend(tiny_llama_dir, backend):
    _check_greedy_equal(tiny_llama_dir, backend, "suffix", {})


def _check_greedy_equal(tiny_llama_dir, backend: str, mode: str, overrides: dict) -> None:
    prompts = _copying_prompts(256)
    reference = _engine(tiny_llama_dir, "off", backend=backend)
    expected = [greedy_generate(reference.model, p, 24) for p in prompts]
    if overrides.get("kv_cache_bytes", 0) is None:
        overrides = dict(kv_cache_bytes=reference.kv_pool.shape.bytes_per_page * 20, max_num_batched_tokens=64)
    engine = _engine(tiny_llama_dir, mode, backend=backend, **overrides)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for _ in range(2):  # the second pass hits the prefix cache (and, with "suffix", the index)
        assert engine.generate(prompts, params) == expected
        _assert_pages_balance(engine)
    assert engine.metrics.num_accepted_draft_tokens > 0
    assert engine.stats().speculation.num_verify_chunks > 0
    if "kv_cache_bytes" in overrides:
        assert engine.stats().num_preemptions > 0


def test_seeded_sampling_gives_the_same_tokens(tiny_llama_dir):
    """One uniform per emitted token, in order: a seeded request draws what it draws without drafts."""
    prompts = _copying_prompts(256, seed=1)
    params = [SamplingParams(max_tokens=20, temperature=t, top_p=p, top_k=k, seed=i, ignore_eos=True,
                             repetition_penalty=r, logprobs=2)
              for i, (t, p, k, r) in enumerate([(0.01, 1.0, -1, 1.0), (0.02, 0.9, -1, 1.1), (0.02, 1.0, 20, 1.0),
                                                (0.05, 1.0, -1, 1.0)] * 3)]
    off = _engine(tiny_llama_dir, "off")
    spec = _engine(tiny_llama_dir, "ngram")
    assert spec.generate(prompts, params) == off.generate(prompts, params)
    assert spec.metrics.num_accepted_draft_tokens > 0
    _assert_pages_balance(spec)


def test_stop_tokens_max_tokens_and_logprobs_per_token(tiny_llama_dir):
    prompts = _copying_prompts(256, seed=2)
    off, spec = _engine(tiny_llama_dir, "off"), _engine(tiny_llama_dir, "ngram")
    free_run = off.generate(prompts, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    # stop at a token each output reaches mid-way, so speculation would have run past it
    cases = [(p, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop_token_ids=(out[10],),
                                logprobs=1))
             for p, out in zip(prompts, free_run)]
    results = {}
    for name, engine in (("off", off), ("spec", spec)):
        requests = [engine.add_request(f"{name}-{i}", p, sp) for i, (p, sp) in enumerate(cases)]
        outputs = {r.request_id: [] for r in requests}
        while engine.has_unfinished():
            for output in engine.step():
                outputs[output.request_id].append(output)
        results[name] = [(r.output_token_ids, r.finish_reason,
                          [lp for o in outputs[r.request_id] for lp in o.logprobs]) for r in requests]
        for r in requests:
            got = outputs[r.request_id]
            assert sum(len(o.new_token_ids) for o in got) == len(r.output_token_ids)
            assert all(len(o.logprobs) == len(o.new_token_ids) == len(o.top_logprobs) for o in got)
            assert got[-1].finish_reason is r.finish_reason and all(o.finish_reason is None for o in got[:-1])
        results[name + " longest output"] = max(len(o.new_token_ids) for got in outputs.values() for o in got)
    assert results["spec longest output"] > 1 and results["off longest output"] == 1
    for (ids_off, reason_off, lp_off), (ids_spec, reason_spec, lp_spec) in zip(results["off"], results["spec"]):
        assert ids_spec == ids_off and reason_spec is reason_off is FinishReason.STOP
        assert lp_spec == pytest.approx(lp_off, abs=1e-4)
    assert spec.metrics.num_accepted_draft_tokens > 0
    _assert_pages_balance(spec)


def test_never_emits_past_max_tokens_and_the_switch_turns_it_off(tiny_llama_dir):
    prompt = _copying_prompts(256, seed=3)[0]
    spec = _engine(tiny_llama_dir, "ngram")
    for max_tokens in (1, 2, 3, 7):
        out = spec.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        assert len(out[0]) == max_tokens
    before = spec.metrics.num_draft_tokens
    spec.add_request("no-spec", prompt, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
                     options=RequestOptions(speculation=False))
    while spec.has_unfinished():
        assert all(len(o.new_token_ids) == 1 for o in spec.step())
    assert spec.metrics.num_draft_tokens == before
    _assert_pages_balance(spec)


def test_drafts_stop_past_the_backends_rows_per_step(tiny_llama_dir):
    """Past max_verify_rows_per_step rows (decodes + drafts) a step verifies no drafts: 6 copying requests
    with room for 8 rows draft at most 2 tokens a step in all; with room for 6, none."""
    prompts = _copying_prompts(256)[:6]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    expected = _engine(tiny_llama_dir, "off").generate(prompts, params)
    for max_rows, max_drafts in ((8, 2), (6, 0)):
        engine = _engine(tiny_llama_dir, "ngram", max_verify_rows_per_step=max_rows)
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, params)
        outputs = {str(i): [] for i in range(len(prompts))}
        while engine.has_unfinished():
            running = sum(1 for r in engine.scheduler.admitted if r.status.value == "running")
            before = engine.metrics.num_draft_tokens
            for output in engine.step():
                outputs[output.request_id] += output.new_token_ids
            if running == len(prompts):
                assert engine.metrics.num_draft_tokens - before <= max_drafts
        assert [outputs[str(i)] for i in range(len(prompts))] == expected


def test_abort_mid_speculation_frees_every_page(tiny_llama_dir):
    spec = _engine(tiny_llama_dir, "ngram", enable_prefix_cache=False)
    spec.add_request("a", _copying_prompts(256)[1], SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))
    while spec.metrics.num_verify_chunks < 3 and spec.has_unfinished():
        spec.step()
    assert spec.abort("a")
    stats = spec.stats()
    assert stats.num_free_pages == stats.num_pages and stats.num_admitted == 0


# ---- the accept / resample rule, on fixed distributions ----------------------------------

def _request(params: SamplingParams) -> Request:
    output: list[int] = []
    return Request("r", [1, 2, 3], make_sampling_state(params, [1, 2, 3], "cpu", output), output_token_ids=output)


def test_verification_keeps_the_target_distribution():
    """Row 0 has distribution p0; row 1 (after draft 0) p1. Over many draws the emitted first token
    follows p0 and, after an accepted draft, the second follows p1 (chi-square at a fixed seed)."""
    p0 = torch.tensor([0.1, 0.4, 0.2, 0.3])
    p1 = torch.tensor([0.5, 0.1, 0.1, 0.3])
    logits = torch.stack([p0.log(), p1.log(), torch.zeros(4)])  # drafts (1, 3): three rows
    torch.manual_seed(0)
    first, second = Counter(), Counter()
    num_runs = 4000
    sampler = Sampler()
    for _ in range(num_runs):
        request = _request(SamplingParams(max_tokens=10, temperature=1.0))
        [result] = sample_and_verify(sampler, logits, [request], [(1, 3)], lambda r, t: None)
        first[result.token_ids[0]] += 1
        if result.token_ids[0] == 1:
            second[result.token_ids[1]] += 1
            assert len(result.token_ids) == (3 if result.token_ids[1] == 3 else 2)
        else:
            assert len(result.token_ids) == 1
    assert _chi_square(first, p0, num_runs) < 16.3  # 3 degrees of freedom, p = 0.001
    assert _chi_square(second, p1, first[1]) < 16.3


def _looping_prompt(model_dir, base: list[int]) -> list[int] | None:
    """base + the start of its greedy continuation, cut where the continuation repeats itself: the
    likeliest next tokens then follow an earlier occurrence of the last two (drafts get accepted)."""
    greedy = greedy_generate(_engine(model_dir, "off").model, base, 30)
    tokens = base + greedy
    for cut in range(len(base) + 2, len(tokens) - 2):
        pair, after = tokens[cut - 1:cut + 1], tokens[cut + 1]
        if any(tokens[i:i + 2] == pair and tokens[i + 2] == after for i in range(cut - 1)):
            return tokens[:cut]
    return None


def _chi_square(counts: Counter, p: torch.Tensor, total: int) -> float:
    return sum((counts[t] - total * float(p[t])) ** 2 / (total * float(p[t])) for t in range(len(p)))


def test_unseeded_sampled_outputs_keep_their_distribution(tiny_llama_dir):
    """Token frequencies of many unseeded runs (global RNG fixed) with and without speculation stay
    within a total-variation bound of each other, first 3 tokens jointly."""
    # the tiny model's logits are small (std ~0.16): a low temperature gives a few likely outcomes
    params = SamplingParams(max_tokens=3, temperature=0.02, ignore_eos=True)
    prompt = next(p for p in map(_looping_prompt, [tiny_llama_dir] * 12, _copying_prompts(256)) if p)
    num_runs = 600
    frequencies = {}
    for mode in ("off", "ngram"):
        engine = _engine(tiny_llama_dir, mode)
        torch.manual_seed(0)
        outputs = engine.generate([prompt] * num_runs, params)
        frequencies[mode] = Counter(tuple(out) for out in outputs)
        if mode == "ngram":
            assert engine.metrics.num_accepted_draft_tokens > 0
    keys = set(frequencies["off"]) | set(frequencies["ngram"])
    total_variation = sum(abs(frequencies["off"][k] - frequencies["ngram"][k]) for k in keys) / 2 / num_runs
    print(f"total variation {total_variation:.3f} over {len(keys)} outcomes")
    assert total_variation < 0.08


@pytest.mark.model
def test_smollm2_mixed_batch_with_grammar_stops_penalties_equals_no_speculation(smollm2_dir):
    """The default model on prompts that copy, batched with a JSON-grammar request, a stop token, logprobs,
    penalties and a bias: every request gets the tokens it gets without speculation."""
    from assembly.chat_template import ChatTemplate
    from assembly.constrained_output import GrammarCompiler, json_grammar
    from assembly.tokenizer import Tokenizer

    tokenizer, template = Tokenizer(smollm2_dir), ChatTemplate.from_model_dir(smollm2_dir)
    passage = ("The radix tree keeps every cached prefix as a run of full pages. A request locks the nodes "
               "it uses, and only unlocked leaves can be evicted.")
    questions = [f"Repeat this sentence exactly: {passage}", f"Quote the first sentence of: {passage}",
                 "Write a JSON object with a name and an age.", f"Summarize: {passage}"]
    prompts = [tokenizer.encode(template.render([{"role": "user", "content": q}])) for q in questions]
    compiler = GrammarCompiler(smollm2_dir / "tokenizer.json", [2], 49152)
    grammar = compiler.check(json_grammar(None))
    stop_id = tokenizer.encode(" unlocked")[0]

    def params() -> list[SamplingParams]:  # fresh grammar processors: they hold a sequence's state
        return [SamplingParams(max_tokens=40, temperature=0.0),
                SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=(stop_id,), logprobs=2),
                SamplingParams(max_tokens=40, temperature=0.0, logits_processors=(compiler.processor(grammar),)),
                SamplingParams(max_tokens=40, temperature=0.0, frequency_penalty=0.5, logit_bias={13: -5.0}),
                SamplingParams(max_tokens=40, temperature=0.7, seed=11)]

    prompts = prompts + [prompts[0]]
    off, spec = _engine(smollm2_dir, "off"), _engine(smollm2_dir, "suffix")
    expected = off.generate(prompts, params())
    assert spec.generate(prompts, params()) == expected
    assert spec.metrics.num_accepted_draft_tokens > 0
    _assert_pages_balance(spec)


class _TemplateGrammar:
    """A grammar over the output as a fixed template: position i takes template[i] when it is not None,
    anything else where it is (past the template: anything). A DraftingLogitsProcessor."""

    def __init__(self, template: list[int | None]):
        self.template = template

    def _fixed(self, position: int) -> int | None:
        return self.template[position] if position < len(self.template) else None

    def __call__(self, token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        fixed = self._fixed(len(token_ids))
        if fixed is not None:
            keep = logits[fixed].clone()
            logits.fill_(float("-inf"))
            logits[fixed] = keep
        return logits

    def forced_tokens(self, token_ids: list[int]) -> list[int]:
        forced = []
        while (fixed := self._fixed(len(token_ids) + len(forced))) is not None:
            forced.append(fixed)
        return forced

    def num_admitted(self, token_ids: list[int], draft_ids: list[int]) -> int:
        for i, token_id in enumerate(draft_ids):
            fixed = self._fixed(len(token_ids) + i)
            if fixed is not None and fixed != token_id:
                return i
        return len(draft_ids)


def test_grammar_forced_tokens_are_drafted_and_outputs_stay_the_same(tiny_llama_dir):
    """Under a grammar, the tokens it forces are drafted (every one accepted), n-gram drafts after them
    only where it admits them, and greedy outputs equal decoding without speculation."""
    prompts = _copying_prompts(256)[:6]
    # runs of forced structure between free stretches, like a tool call's JSON around its arguments
    template = [40, 41, 42, 43, None, None, None, 50, 51, 52, None, None, None, None, 60, 61, 62, 63, 64, None]

    def params():
        return [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                               logits_processors=(_TemplateGrammar(template),)) for _ in prompts]

    expected = _engine(tiny_llama_dir, "off").generate(prompts, params())
    assert all(out[:4] == [40, 41, 42, 43] and out[14:19] == [60, 61, 62, 63, 64] for out in expected)
    engine = _engine(tiny_llama_dir, "ngram")
    proposals = []
    propose = engine.proposer.propose

    def checked_propose(request, max_tokens):
        drafts = propose(request, max_tokens)
        grammar = request.sampling.params.logits_processors[0]
        assert grammar.num_admitted(request.output_token_ids, drafts) == len(drafts)  # never against it
        proposals.append((len(request.output_token_ids), drafts))
        return drafts

    engine.proposer.propose = checked_propose
    assert engine.generate(prompts, params()) == expected
    _assert_pages_balance(engine)
    # the first token comes from the prefill; the next decode drafts the rest of the forced run, and so on
    assert all(drafts[:3] == [41, 42, 43] for position, drafts in proposals if position == 1)
    assert any(drafts[:5] == [60, 61, 62, 63, 64] for position, drafts in proposals if position == 14)
    assert engine.metrics.num_accepted_draft_tokens >= len(prompts) * 5


@pytest.mark.model
def test_smollm2_forced_tool_call_drafts_the_grammars_structure(smollm2_dir):
    """A forced tool call (the server's grammar for tool_choice "required"): the JSON around the
    arguments and the tool name once its prefix is unique are drafted, never a token the grammar
    refuses, and greedy output is that of decoding without speculation."""
    from assembly.chat_template import ChatTemplate
    from assembly.constrained_output import GrammarCompiler, tool_call_grammar
    from assembly.tokenizer import Tokenizer
    from bench.agent_tools import TOOLS

    tokenizer, template = Tokenizer(smollm2_dir), ChatTemplate.from_model_dir(smollm2_dir)
    compiler = GrammarCompiler(smollm2_dir / "tokenizer.json", [2], 49152)
    tools = [{"name": t["function"]["name"], "parameters": t["function"]["parameters"]} for t in TOOLS]
    grammar = compiler.check(tool_call_grammar(tools, parallel=False))
    tasks = ["Read the file setup.py.", "List the directory src recursively.", "Search the docs for asyncio."]
    prompts = [tokenizer.encode(template.render([{"role": "user", "content": task}])) for task in tasks]

    def params():
        return [SamplingParams(max_tokens=32, temperature=0.0, logits_processors=(compiler.processor(grammar),))
                for _ in prompts]

    expected = _engine(smollm2_dir, "off").generate(prompts, params())
    engine = _engine(smollm2_dir, "ngram")
    propose = engine.proposer.propose

    def checked_propose(request, max_tokens):
        drafts = propose(request, max_tokens)
        fresh = compiler.processor(grammar)  # a grammar of its own, fed the request's output afresh
        assert fresh.num_admitted(list(request.output_token_ids), drafts) == len(drafts)
        return drafts

    engine.proposer.propose = checked_propose
    outputs = engine.generate(prompts, params())
    assert outputs == expected
    assert all(tokenizer.decode(out).startswith('<tool_call>\n{"name": "') for out in outputs)
    assert engine.metrics.num_accepted_draft_tokens >= 9 * len(prompts)  # the opening is 10 forced tokens
    _assert_pages_balance(engine)

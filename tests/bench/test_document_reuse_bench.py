"""The document reuse benches: the prompt generator's shuffling, the KL / agreement metrics on known
inputs, the collection workload, the speed table; a smoke of the quality harness on the real model."""

import dataclasses
import json
import math
from collections import defaultdict

import pytest
import torch

from bench.document_reuse_bench import REUSE_OFF, REUSE_ON, document_reuse_table
from bench.document_reuse_metrics import compare_prompt, row_kl, row_top1_agreement, summarize_quality
from bench.document_reuse_prompts import STYLES, answer_is_correct, rag_prompts
from engine.document_reuse_stats import DocumentReuseStats
from engine.metrics import EngineStats
from bench.metrics import RequestOutcome, summarize
from bench.rag_collection_workload import COLLECTION, collection_passages, rag_collection_workload
from bench.rag_workload import rag_workload
from bench.results import ServerRun
from bench.runner import WorkloadRun
from bench.workload_sizes import QUICK


@pytest.fixture(scope="module")
def prompts():
    return rag_prompts(num_prompts=60, num_pool_documents=15, num_documents=4, document_words=60, seed=0)


def test_prompts_are_deterministic_and_seeded(prompts):
    assert rag_prompts(60, 15, 4, 60, seed=0) == prompts
    assert rag_prompts(60, 15, 4, 60, seed=1)[1] != prompts[1]


def test_documents_are_shuffled_across_positions_and_neighbours(prompts):
    pool, items = prompts
    positions, predecessors = defaultdict(set), defaultdict(set)
    for prompt in items:
        assert len(set(prompt.document_ids)) == len(prompt.document_ids) == 4
        for position, document in enumerate(prompt.document_ids):
            positions[document].add(position)
            predecessors[document].add(prompt.document_ids[position - 1] if position else None)
    assert set(positions) == set(range(len(pool)))  # every passage is used
    assert all(len(p) >= 2 for p in positions.values())  # at more than one position
    assert all(len(p) >= 3 for p in predecessors.values())  # after different passages


def test_styles_take_turns_and_place_the_documents(prompts):
    pool, items = prompts
    assert [p.style for p in items[:6]] == list(STYLES) * 2
    for prompt in items:
        texts = [pool[d] for d in prompt.document_ids]
        if prompt.style == "documents":
            assert [d["text"] for d in prompt.documents] == texts
            assert all(text not in m["content"] for m in prompt.messages for text in texts)
        else:
            where = prompt.messages[0 if prompt.style == "system" else 1]["content"]
            assert prompt.documents == () and all(text in where for text in texts)
            assert [where.index(text) for text in texts] == sorted(where.index(text) for text in texts)


def test_the_question_word_is_in_exactly_the_answer_document(prompts):
    pool, items = prompts
    assert {p.is_scored for p in items} == {True, False}
    for prompt in items:
        holders = [n for n, d in enumerate(prompt.document_ids, start=1)
                   if prompt.question_word in pool[d].lower()]
        assert prompt.answer_number in holders
        assert f'"{prompt.question_word}"' in prompt.messages[-1]["content"]


def test_answer_scoring_reads_the_first_document_number(prompts):
    prompt = dataclasses.replace(prompts[1][0], answer_number=2)
    assert answer_is_correct("Document [2] mentions it.", prompt)
    assert answer_is_correct("It is 2, not 3", prompt)
    assert not answer_is_correct("Document 3, then 2", prompt)
    assert not answer_is_correct("In 2019 ...", prompt)  # not a document number
    assert not answer_is_correct("I do not know", prompt)


def test_kl_is_zero_for_equal_rows_and_matches_the_closed_form():
    logits = torch.randn(3, 50)
    assert torch.allclose(row_kl(logits, logits.clone()), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    p, q = torch.tensor([[0.7, 0.2, 0.1]]), torch.tensor([[0.4, 0.4, 0.2]])
    expected = sum(a * math.log(a / b) for a, b in zip(p[0].tolist(), q[0].tolist()))
    assert row_kl(p.log(), q.log()).item() == pytest.approx(expected, rel=1e-6)
    assert row_kl(p.log() + 5.0, q.log() - 3.0).item() == pytest.approx(expected, rel=1e-6)  # logits, not log-probs
    assert row_kl(q.log(), p.log()).item() != pytest.approx(expected)  # not symmetric: exact first
    with pytest.raises(ValueError):
        row_kl(torch.zeros(2, 3), torch.zeros(3, 3))


def test_agreement_compares_the_top_tokens():
    exact = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    reuse = torch.tensor([[0.0, 5.0, 1.0], [0.0, 0.0, 3.0]])
    assert row_top1_agreement(exact, reuse).tolist() == [True, False]


def test_compare_and_summarize_use_row_zero_for_the_first_token_and_the_answer_rows():
    exact = torch.tensor([[0.0, 9.0, 0.0], [9.0, 0.0, 0.0], [0.0, 0.0, 9.0], [5.0, 5.0, 5.0]])
    reuse = exact.clone()
    reuse[1] = torch.tensor([0.0, 9.0, 0.0])  # the second answer token differs
    reuse[3] = torch.tensor([9.0, 0.0, 0.0])  # the row after the answer is not scored
    comparison = compare_prompt(exact, reuse, num_answer_tokens=3)
    assert comparison.is_first_token_same and comparison.first_token_kl == pytest.approx(0.0, abs=1e-12)
    assert comparison.answer_agreements == (True, False, True)
    assert comparison.answer_kls[1] > 1.0 and comparison.answer_kls[0] == pytest.approx(0.0, abs=1e-12)
    same = compare_prompt(exact, exact, num_answer_tokens=3)
    summary = summarize_quality([comparison, same])
    assert summary.first_token_agreement == 1.0
    assert summary.answer_top1_agreement == pytest.approx(5 / 6)
    assert summary.answer_kl_mean == pytest.approx(comparison.answer_kls[1] / 6)


def test_the_collection_workload_asks_the_rag_questions_over_other_passages():
    sizes = dataclasses.replace(QUICK, rag_num_requests=5)
    rag, collection = rag_workload(sizes, 3), rag_collection_workload(sizes, 3)
    rag_first = [s.first_request() for s in rag.sessions]
    collection_first = [s.first_request() for s in collection.sessions]
    assert [r.messages[-1] for r in rag_first] == [r.messages[-1] for r in collection_first]
    passages = collection_passages(sizes)
    assert len(passages) == sizes.rag_num_corpus_documents
    assert all(p not in rag_first[0].messages[0]["content"] for p in passages)
    for request in collection_first:
        retrieval = request.extra_body["retrieval"]
        assert retrieval["collection"] == COLLECTION and retrieval["top_k"] == sizes.rag_top_k
        assert retrieval["query"] and any(retrieval["query"] in " ".join(p.split()) for p in passages)


def _run(workload: str, ttft_s: float, num_prompt: int, num_cached: int) -> WorkloadRun:
    outcomes = [RequestOutcome(i, 0, num_prompt, 4, num_cached, ttft_s, ttft_s + 0.1, (), 0.0) for i in range(3)]
    return WorkloadRun(workload, "", tuple(outcomes), summarize(outcomes, 1.0))


def test_the_speed_table_gives_ratios_against_reuse_off_and_the_targets():
    off = ServerRun(REUSE_OFF, "m", (_run("rag", 1.0, 1000, 300), _run("rag_collection", 1.0, 1000, 100)))
    on = ServerRun(REUSE_ON, "m", (_run("rag", 0.4, 1000, 700), _run("rag_collection", 0.2, 1000, 950)))
    table = document_reuse_table([on, off])
    rag_on = next(line for line in table.splitlines() if line.startswith(f"| rag | {REUSE_ON}"))
    assert "| 900 |" in rag_on and "0.43x (meets)" in rag_on and "0.40x (meets)" in rag_on
    collection_on = next(line for line in table.splitlines() if line.startswith(f"| rag_collection | {REUSE_ON}"))
    assert "0.06x (meets)" in collection_on and "0.20x (meets)" in collection_on
    missed = ServerRun(REUSE_ON, "m", (_run("rag", 0.9, 1000, 400),))
    assert "0.86x (misses)" in document_reuse_table([missed, off])
    assert document_reuse_table([on]) == ""  # nothing to compare with


@pytest.mark.model
def test_the_harness_self_test_agrees_exactly(smollm2_dir):
    """Reuse off on both sides through the harness's own passes: agreement 1.0, KL ~0."""
    from bench import document_reuse_quality as quality
    from assembly.chat_template import ChatTemplate
    from assembly.prompt_builder import PromptBuilder
    from assembly.segment_tokenizer import SegmentTokenizer
    from assembly.tokenizer import Tokenizer

    tokenizer = Tokenizer(smollm2_dir)
    builder = PromptBuilder(SegmentTokenizer(tokenizer), ChatTemplate.from_model_dir(smollm2_dir))
    pool, items = rag_prompts(num_prompts=3, num_pool_documents=4, num_documents=4, document_words=20, seed=0)
    built = [quality.build_prompt(builder, p) for p in items]
    documents_prompt = next(b for b in built if b.prompt.style == "documents")
    assert len(documents_prompt.exact_spans) == 4
    for (start, end), document in zip(documents_prompt.exact_spans, documents_prompt.prompt.documents):
        assert tokenizer.decode(documents_prompt.token_ids[start:end]).strip() == document["text"]
    variant = quality.Variant("self-test", document_reuse=False)
    engine = quality._engine(smollm2_dir, variant)
    answers = quality.exact_pass(engine, built, tokenizer)
    assert all(1 <= len(a.answer_ids) <= quality.NUM_ANSWER_TOKENS for a in answers)
    comparisons, computed, reused, _ = quality.reuse_pass(engine, variant, built, answers, ([], []))
    summary = summarize_quality(comparisons)
    assert summary.first_token_agreement == 1.0 and summary.answer_top1_agreement == 1.0
    assert summary.first_token_kl_mean < 1e-6 and summary.answer_kl_mean < 1e-6
    assert all(0 <= c <= len(b.token_ids) for c, b in zip(computed, built)) and reused == [0, 0, 0]


def test_the_quality_report_writes_json_and_a_table_with_the_gates(tmp_path):
    from bench.document_reuse_quality import Variant
    from bench.document_reuse_report import QualityRun, VariantResult, write_quality_report

    same = compare_prompt(torch.eye(3), torch.eye(3), 2)
    differs = compare_prompt(torch.eye(3), torch.eye(3).flip(0), 2)
    stats = EngineStats(*([0] * 10), documents=DocumentReuseStats(num_reused_tokens=120))
    good = VariantResult.of(Variant("online, k=16", True, 16), [same, same], [50, 40], [100, 20], 0,
                            [True, False], 1.0, stats)
    bad = VariantResult.of(Variant("online, k=0", True, 0), [differs, same], [30, 30], [100, 0], 0,
                           [True, False], 1.0, stats)
    assert good.passes_gates and not bad.passes_gates
    assert bad.with_reuse.num_prompts == 1 and bad.with_reuse.first_token_agreement == 0.0
    run = QualityRun(args={"documents_per_prompt": 4, "quick": True}, model="/m/smollm2", num_prompts=2,
                     mean_prompt_tokens=200.0, num_pool_documents=8, exact_seconds=1.0,
                     exact_computed_tokens=[150, 150], exact_accuracy=0.5, num_scored=2, chance_accuracy=0.25,
                     mean_answer_tokens=2.0, sample_answers=[("q", "a")], variants=[good, bad], notes=["n"],
                     total_seconds=2.0)
    json_path, md_path = write_quality_report(run, tmp_path / "quality")
    table = md_path.read_text()
    assert "| online, k=16 | 1.000 | 0.0000 | 1.000 | 0.0000 | 0.300 | 0.300 |" in table
    assert "| online, k=0 | 0.500 |" in table and "| fail |" in table and "| pass |" in table
    assert json.loads(json_path.read_text())["computed_ratios"] == {"online, k=16": 0.3, "online, k=0": 0.2}

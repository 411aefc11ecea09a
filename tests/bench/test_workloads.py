"""Workload generators: deterministic for a seed, shaped as configured, sharing what they should."""

import dataclasses
import json

import pytest

from bench import corpus
from bench.agent_tools import TOOLS
from bench.arrivals import arrival_offsets_s
from bench.rag_workload import draw_distinct, zipf_weights
from bench.workload_sizes import QUICK, WorkloadSizes
from bench.workloads import WORKLOAD_NAMES, build_workload


def first_requests(workload):
    return [session.first_request() for session in workload.sessions]


def test_corpus_is_prose_and_deterministic():
    docs = corpus.documents(10, 100)
    assert len(docs) == 10 and all(len(d.split()) >= 100 for d in docs)
    assert len(corpus.paragraphs()) > 500 and len(corpus.words()) > 1000
    assert list(corpus.words()) == sorted(corpus.words())
    with pytest.raises(ValueError):
        corpus.documents(10_000, 1_000)


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_same_seed_same_requests_other_seed_other_requests(name):
    same = [first_requests(build_workload(name, QUICK, seed=7)) for _ in range(2)]
    assert same[0] == same[1]
    assert first_requests(build_workload(name, QUICK, seed=8)) != same[0]


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_requests_are_plain_chat_json(name):
    for request in first_requests(build_workload(name, QUICK, seed=0)):
        json.dumps(request.messages)
        assert all(set(m) == {"role", "content"} for m in request.messages)
        assert request.max_tokens == QUICK.max_tokens and request.tools == ()


def test_sizes_give_request_counts():
    sizes = WorkloadSizes()
    counts = {name: build_workload(name, sizes, 0).num_requests for name in WORKLOAD_NAMES}
    assert counts == {"agent": sizes.agent_num_sessions * sizes.agent_num_turns, "rag": sizes.rag_num_requests,
                      "shared_prefix": sizes.shared_num_groups * sizes.shared_prompts_per_group,
                      "random": sizes.random_num_requests}


def test_agent_turns_extend_the_previous_prompt_with_the_real_reply():
    sizes = dataclasses.replace(QUICK, agent_num_turns=3)
    session = build_workload("agent", sizes, 0).sessions[0]
    first = session.first_request()
    assert "search_docs" in first.messages[0]["content"]  # tools as text in the system prompt
    second = session.next_request("REPLY-1")
    assert second.messages[: len(first.messages)] == first.messages
    assert second.messages[len(first.messages)] == {"role": "assistant", "content": "REPLY-1"}
    assert second.messages[-1]["content"].startswith("Tool result: {")
    third = session.next_request("REPLY-2")
    assert third.messages[: len(second.messages)] == second.messages
    assert session.next_request("REPLY-3") is None
    assert session.first_request() == first  # no side effects


def test_agent_sessions_share_the_system_prompt_only():
    workload = build_workload("agent", QUICK, 0)
    firsts = first_requests(workload)
    assert len({r.messages[0]["content"] for r in firsts}) == 1
    assert len({r.messages[1]["content"] for r in firsts}) == len(firsts)


def test_agent_native_tools_mode_sends_openai_tools():
    request = build_workload("agent", QUICK, 0, native_tools=True).sessions[0].first_request()
    assert request.tools == TOOLS and len(TOOLS) == 6
    assert "search_docs" not in request.messages[0]["content"]


def test_zipf_draws_favour_popular_documents_in_canonical_order():
    import random

    rng = random.Random(0)
    weights = zipf_weights(20, 1.1)
    draws = [draw_distinct(rng, weights, 3) for _ in range(500)]
    assert all(d == sorted(set(d)) and len(d) == 3 for d in draws)
    num_with_top = sum(0 in d for d in draws)
    num_with_last = sum(19 in d for d in draws)
    assert num_with_top > 5 * num_with_last


def test_rag_requests_share_instructions_and_vary_documents():
    systems = [r.messages[0]["content"] for r in first_requests(build_workload("rag", WorkloadSizes(), 0))]
    assert len({s.split("\n\n")[0] for s in systems}) == 1
    assert len(set(systems)) > 1


def test_shared_prefix_groups_interleave():
    requests = first_requests(build_workload("shared_prefix", WorkloadSizes(), 0))
    systems = [r.messages[0]["content"] for r in requests]
    sizes = WorkloadSizes()
    assert len(set(systems)) == sizes.shared_num_groups
    assert systems != sorted(systems, key=systems.index)  # shuffled, not group by group


def test_random_prompts_share_nothing():
    requests = first_requests(build_workload("random", WorkloadSizes(), 0))
    first_words = [r.messages[0]["content"].split()[:3] for r in requests]
    assert len({tuple(w) for w in first_words}) == len(requests)
    lengths = [len(r.messages[0]["content"].split()) for r in requests]
    assert WorkloadSizes().random_min_words <= min(lengths) < max(lengths) <= WorkloadSizes().random_max_words


def test_arrivals():
    assert arrival_offsets_s(3, float("inf"), 1.0, seed=0) == [0.0, 0.0, 0.0]
    offsets = arrival_offsets_s(2000, 4.0, 1.0, seed=0)
    assert offsets == arrival_offsets_s(2000, 4.0, 1.0, seed=0)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert offsets[-1] / 1999 == pytest.approx(0.25, rel=0.1)  # mean gap 1 / rate
    with pytest.raises(ValueError):
        arrival_offsets_s(3, 0.0, 1.0, seed=0)


def test_sizes_are_validated():
    with pytest.raises(ValueError):
        WorkloadSizes(max_tokens=0)
    with pytest.raises(ValueError):
        WorkloadSizes(rag_top_k=5, rag_num_corpus_documents=4)

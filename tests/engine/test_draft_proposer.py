"""Draft proposals on plain token lists: prompt lookup, the cross-request suffix index, the choice by
match length and agreement, and the adaptive draft length."""

import itertools
from types import SimpleNamespace

import pytest

from engine.draft_index import MAX_MATCH, Continuation, SequenceNgrams, SuffixIndex
from engine.draft_proposer import (COOLDOWN_STEPS, INITIAL_ACCEPTANCE, DraftLength, DraftProposer,
                                   best_draft_length, choose_draft, match_class)


_REQUEST_IDS = itertools.count()


def _request(tokens: list[int], salt=None, processors=(), num_prompt_tokens: int | None = None):
    num_prompt_tokens = len(tokens) if num_prompt_tokens is None else num_prompt_tokens
    return SimpleNamespace(request_id=f"r{next(_REQUEST_IDS)}", all_token_ids=tokens,
                           output_token_ids=tokens[num_prompt_tokens:], cache_salt=salt, sampling=SimpleNamespace(params=SimpleNamespace(logits_processors=processors)))


def test_prompt_lookup_drafts_what_followed_the_last_tokens():
    tokens = [1, 2, 3, 4, 5, 6, 9, 9, 2, 3]
    assert DraftProposer("ngram").propose(_request(tokens), 3) == [4, 5, 6]


def test_the_longest_match_wins_over_a_more_recent_shorter_one():
    # "7 2 3" occurred before "8"; a later "2 3" (shorter match with the query "... 7 2 3") before "5"
    tokens = [7, 2, 3, 8, 8, 8, 0, 2, 3, 5, 5, 7, 2, 3]
    assert DraftProposer("ngram").propose(_request(tokens), 1) == [8]


def test_continuations_that_disagree_stop_the_draft():
    a = Continuation([1, 2, 10, 11, 12], 2, 2)
    b = Continuation([1, 2, 10, 15, 13], 2, 2)
    c = Continuation([1, 2, 10, 14, 13], 2, 2)
    assert choose_draft([a, b, c], 5) == [10]  # then 11, 15, 14: one of three each, no majority
    assert choose_draft([a, c, Continuation([1, 2, 10, 11, 13], 2, 2)], 5) == [10, 11, 12]  # 2 of 3, then a tie
    assert choose_draft([c, a], 5) == [10, 14, 13]  # a tie goes to the earlier (more recent) one
    assert choose_draft([], 5) == [] and choose_draft([a], 0) == []


def test_the_own_index_grows_incrementally_and_never_matches_the_query_itself():
    index = SequenceNgrams()
    tokens = [5, 6, 7]
    assert index.continuations(tokens) == []
    tokens += [5, 6]
    [found] = index.continuations(tokens)
    assert (found.start, found.match_len, found.tokens[found.start]) == (2, 2, 7)
    assert index.num_indexed == len(tokens)


def test_suffix_index_serves_other_requests_within_their_salt_and_its_bound():
    index = SuffixIndex(max_tokens=12)
    index.add([1, 2, 3, 4, 5, 6], salt="a")
    assert [c.tokens[c.start:] for c in index.continuations([9, 2, 3], salt="a")] == [[4, 5, 6]]
    assert index.continuations([9, 2, 3], salt="b") == []
    index.add([20, 21, 22, 23, 24, 25, 26, 27], salt="a")  # 14 tokens > 12: the oldest leaves
    assert index.num_sequences == 1 and index.num_tokens == 8
    assert index.continuations([9, 2, 3], salt="a") == []
    assert [c.tokens[c.start] for c in index.continuations([21, 22], salt="a")] == [23]


def test_suffix_mode_drafts_from_a_finished_request():
    proposer = DraftProposer("suffix")
    proposer.record_finished(_request([40, 41, 42, 43, 44, 45]))
    assert proposer.propose(_request([1, 2, 42, 43]), 2) == [44, 45]
    assert DraftProposer("ngram").propose(_request([1, 2, 42, 43]), 2) == []


def test_match_length_is_capped():
    tokens = [3] * 40
    [*found] = SequenceNgrams().continuations(tokens)
    assert max(c.match_len for c in found) == MAX_MATCH


def test_the_draft_length_follows_acceptance_and_row_costs():
    cpu_costs = (1.0, 1.42, 1.50, 1.85, 2.25, 2.58, 2.9, 3.27)
    assert best_draft_length(0.95, cpu_costs, 7) >= 3
    assert best_draft_length(0.7, cpu_costs, 7) == 2  # 3 rows cost about what 2 do
    assert best_draft_length(0.2, cpu_costs, 7) == 0  # a plain decode emits more per unit of cost
    assert best_draft_length(0.2, (1.0,) * 9, 7) == 7  # free rows: always the most
    length = DraftLength(4, cpu_costs)
    assert length.next_k() > 0
    for _ in range(6):
        length.observe(2, 0)
    assert length.next_k() == 0  # no longer pays: a cooldown
    assert [length.next_k() for _ in range(COOLDOWN_STEPS + 1)] == [0] * COOLDOWN_STEPS + [1]  # then a probe
    length.observe(1, 1)
    assert not length.is_probing[0]


def test_short_matches_that_fail_do_not_stop_long_ones():
    """Each match class (2-3, 4-7, 8 repeated tokens) keeps its own estimate and cooldown."""
    assert [match_class(n) for n in (2, 3, 4, 7, MAX_MATCH)] == [0, 0, 1, 1, 2]
    length = DraftLength(4, (1.0, 1.22, 1.44, 1.76, 2.11))
    for _ in range(6):
        length.observe(2, 0, match=0)
    assert length.next_k(0) == 0
    assert length.next_k(2) >= 2  # long matches start out trusted: 3 rows cost far less than 3 steps
    for _ in range(4):
        length.observe(3, 3, match=2)
    assert length.next_k(2) == 4 and length.num_cooldown_steps[0] == COOLDOWN_STEPS


def test_a_proposal_is_judged_by_its_match_class():
    proposer = DraftProposer("ngram")
    long_match = list(range(10, 20)) + [7] + list(range(10, 19))  # the last 9 tokens occurred before
    request = _request(long_match)
    assert proposer.propose(request, 4) == [19, 7, 10, 11]
    proposer.observe(request, 4, 1)
    state = proposer.states[request.request_id]
    assert state.match == 2
    assert state.length.acceptance[:2] == list(INITIAL_ACCEPTANCE[:2])
    assert state.length.acceptance[2] < INITIAL_ACCEPTANCE[2]
    proposer.forget(request)
    assert proposer.states == {}


def test_modes_are_checked():
    with pytest.raises(ValueError):
        DraftProposer("off")
    with pytest.raises(ValueError):
        SuffixIndex(0)

"""find_spans on plain token lists: content-defined, exact spans as hard boundaries."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.document_spans import find_spans

VOCAB_SIZE = 49152


def random_tokens(rng: random.Random, num_tokens: int) -> list[int]:
    # A text-like mix: most tokens from a small frequent set, some from the whole vocabulary.
    return [rng.randrange(2000) if rng.random() < 0.7 else rng.randrange(VOCAB_SIZE) for _ in range(num_tokens)]


def spans_inside(spans, start: int, end: int) -> list[tuple[int, int]]:
    """The spans within [start, end), shifted to start at 0."""
    return [(s - start, e - start) for s, e in spans if start <= s and e <= end]


# The longest chunk is < MAX_CHUNK_TOKENS + MIN_CHUNK_TOKENS; the spans of a passage may differ in
# the chunk that straddles each of its edges and the one next to it, no further in.
MAX_EDGE_TOKENS = 2 * (256 + 64)


def assert_same_interior(spans_a, spans_b, passage_len: int) -> list[tuple[int, int]]:
    """Both span lists (of one passage) agree everywhere but near its edges; returns the shared ones."""
    shared = sorted(set(spans_a) & set(spans_b))
    assert shared
    first_start, last_end = shared[0][0], shared[-1][1]
    between = lambda spans: [(s, e) for s, e in spans if first_start <= s and e <= last_end]  # noqa: E731
    assert between(spans_a) == between(spans_b) == shared
    assert first_start < MAX_EDGE_TOKENS and passage_len - last_end < MAX_EDGE_TOKENS
    return shared


@pytest.mark.parametrize("seed", range(40))
def test_a_passage_at_two_offsets_in_two_prompts_gives_the_same_interior_spans(seed):
    rng = random.Random(seed)
    passage = random_tokens(rng, rng.randrange(600, 2000))
    prefix_a, suffix_a = random_tokens(rng, rng.randrange(0, 700)), random_tokens(rng, rng.randrange(0, 300))
    prefix_b, suffix_b = random_tokens(rng, rng.randrange(0, 700)), random_tokens(rng, rng.randrange(0, 300))
    prompt_a, prompt_b = prefix_a + passage + suffix_a, prefix_b + passage + suffix_b

    inside_a = spans_inside(find_spans(prompt_a), len(prefix_a), len(prefix_a) + len(passage))
    inside_b = spans_inside(find_spans(prompt_b), len(prefix_b), len(prefix_b) + len(passage))

    shared = assert_same_interior(inside_a, inside_b, len(passage))
    # the shared spans are the same tokens, so they are the same keys in the store
    for start, end in shared:
        assert prompt_a[len(prefix_a) + start : len(prefix_a) + end] == passage[start:end]


@pytest.mark.parametrize("seed", range(40))
def test_the_same_text_as_an_exact_span_and_pasted_gives_the_same_interior_spans(seed):
    rng = random.Random(1000 + seed)
    document = random_tokens(rng, rng.randrange(400, 1500))
    before, after = random_tokens(rng, rng.randrange(1, 500)), random_tokens(rng, rng.randrange(1, 200))
    prompt = before + document + after
    document_span = (len(before), len(before) + len(document))

    as_exact = spans_inside(find_spans(prompt, [document_span]), *document_span)
    pasted = spans_inside(find_spans(prompt), *document_span)
    alone = find_spans(document, [(0, len(document))])

    assert_same_interior(as_exact, pasted, len(document))
    # an exact span is chunked as if it stood alone: what precedes it changes nothing
    assert as_exact == alone


def test_an_exact_span_is_chunked_the_same_whatever_surrounds_it():
    rng = random.Random(7)
    document = random_tokens(rng, 900)
    expected = find_spans(document, [(0, len(document))])
    for num_before, num_after in [(0, 0), (1, 0), (13, 5), (300, 40), (1000, 1000)]:
        prompt = random_tokens(rng, num_before) + document + random_tokens(rng, num_after)
        spans = find_spans(prompt, [(num_before, num_before + len(document))])
        assert spans_inside(spans, num_before, num_before + len(document)) == expected


def test_short_prompts_and_short_exact_spans_give_no_spans():
    rng = random.Random(3)
    assert find_spans([]) == []
    assert find_spans(random_tokens(rng, 63)) == []
    prompt = random_tokens(rng, 200)
    assert spans_inside(find_spans(prompt, [(100, 150)]), 100, 150) == []
    assert find_spans(random_tokens(rng, 64), min_span_tokens=64) in ([], [(0, 64)])


@pytest.mark.parametrize("num_tokens", [64, 100, 127])
def test_a_short_document_is_one_span(num_tokens):
    rng = random.Random(num_tokens)
    for _ in range(20):
        document = random_tokens(rng, num_tokens)
        prompt = random_tokens(rng, 50) + document + random_tokens(rng, 50)
        assert spans_inside(find_spans(prompt, [(50, 50 + num_tokens)]), 50, 50 + num_tokens) == [(0, num_tokens)]


def test_a_long_prompt_is_cut_into_several_bounded_chunks():
    spans = find_spans(random_tokens(random.Random(11), 8192))
    lengths = [end - start for start, end in spans]
    assert len(spans) > 8192 // 256
    assert min(lengths) >= 64 and max(lengths) < 256 + 64
    # nearly all of a prompt of fresh text is covered (only runs of short gaps are dropped)
    assert sum(lengths) > 0.8 * 8192


def test_bad_exact_spans_are_refused():
    prompt = list(range(300))
    with pytest.raises(ValueError, match="not inside"):
        find_spans(prompt, [(200, 301)])
    with pytest.raises(ValueError, match="not inside"):
        find_spans(prompt, [(10, 10)])
    with pytest.raises(ValueError, match="overlaps"):
        find_spans(prompt, [(0, 100), (50, 150)])


def test_repetitive_tokens_still_give_bounded_spans():
    # No candidate at all (one token repeated): the maximum length cuts.
    spans = find_spans([5] * 1000)
    assert spans and all(64 <= end - start < 256 + 64 for start, end in spans)
    assert spans[0][0] == 0 and spans[-1][1] == 1000


@st.composite
def prompts_with_exact_spans(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    num_tokens = draw(st.integers(0, 3000))
    token_ids = random_tokens(rng, num_tokens)
    edges = sorted(set(draw(st.lists(st.integers(0, num_tokens), max_size=10))))
    exact_spans = [(start, end) for start, end in zip(edges[::2], edges[1::2]) if start < end]
    rng.shuffle(exact_spans)  # any order is accepted
    min_span_tokens = draw(st.sampled_from([1, 16, 64, 100]))
    return token_ids, exact_spans, min_span_tokens


@settings(max_examples=200, deadline=None)
@given(prompts_with_exact_spans())
def test_spans_are_sorted_disjoint_in_bounds_long_enough_and_never_cross_an_exact_span(case):
    token_ids, exact_spans, min_span_tokens = case
    spans = find_spans(token_ids, exact_spans, min_span_tokens)

    assert spans == find_spans(token_ids, exact_spans, min_span_tokens)  # deterministic
    assert spans == sorted(spans)
    for (_, end), (next_start, _) in zip(spans, spans[1:]):
        assert end <= next_start
    for start, end in spans:
        assert 0 <= start < end <= len(token_ids)
        assert end - start >= min_span_tokens
        for exact_start, exact_end in exact_spans:
            assert not start < exact_start < end and not start < exact_end < end

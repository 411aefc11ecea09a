"""Token-aware chunking: windows of at most max_tokens, overlapping, at word and sentence ends."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval.chunking import ChunkingConfig, TokenSpans, chunk_text


def pieces(text: str, piece_len: int = 3) -> TokenSpans:
    """A word-piece tokenizer stand-in: each word (or punctuation mark) split into pieces of `piece_len` chars."""
    offsets, word_ids = [], []
    for word_id, match in enumerate(re.finditer(r"\w+|[^\w\s]", text)):
        for start in range(match.start(), match.end(), piece_len):
            offsets.append((start, min(start + piece_len, match.end())))
            word_ids.append(word_id)
    return TokenSpans(offsets, word_ids)


def _token_range(spans: TokenSpans, chunk) -> range:
    starts = [s for s, _ in spans.offsets]
    first = starts.index(chunk.start_char)
    return range(first, first + chunk.num_tokens)


def test_short_text_is_one_chunk():
    text = "  Hello, world.  "
    chunks = chunk_text(text, pieces(text), ChunkingConfig(max_tokens=50, overlap_tokens=5))
    assert [c.text for c in chunks] == ["Hello, world."]
    assert chunks[0].start_char == 2 and chunks[0].num_tokens == 6  # Hel lo , wor ld .


def test_empty_text_has_no_chunks():
    assert chunk_text("   ", pieces("   ")) == []


def test_consecutive_chunks_overlap():
    text = " ".join(f"w{i}" for i in range(100))  # one piece per word
    chunks = chunk_text(text, pieces(text, piece_len=10), ChunkingConfig(max_tokens=20, overlap_tokens=5))
    assert [c.text.split()[0] for c in chunks[:3]] == ["w0", "w15", "w30"]
    assert chunks[0].text.split()[-5:] == chunks[1].text.split()[:5]


def test_chunks_end_at_sentences_when_they_can():
    text = " ".join(f"Sentence number {i} is here." for i in range(40))
    chunks = chunk_text(text, pieces(text), ChunkingConfig(max_tokens=40, overlap_tokens=8))
    assert len(chunks) > 3
    assert all(c.text.endswith(".") for c in chunks)


def test_a_word_longer_than_the_window_is_split():
    text = "a" * 100 + " end"
    chunks = chunk_text(text, pieces(text), ChunkingConfig(max_tokens=10, overlap_tokens=2))
    assert all(c.num_tokens <= 10 for c in chunks)
    assert chunks[-1].text.endswith("end")


@pytest.mark.parametrize("max_tokens, overlap", [(0, 0), (10, 10), (10, -1)])
def test_bad_config_is_refused(max_tokens, overlap):
    with pytest.raises(ValueError):
        ChunkingConfig(max_tokens, overlap)


words = st.text(alphabet="abcdefghij", min_size=1, max_size=12)
separators = st.sampled_from([" ", "  ", ". ", "\n", ", ", "! "])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(words, separators), min_size=1, max_size=120), st.integers(2, 30), st.data())
def test_invariants(parts, max_tokens, data):
    overlap = data.draw(st.integers(0, max_tokens - 1))
    text = "".join(w + s for w, s in parts)
    spans = pieces(text)
    chunks = chunk_text(text, spans, ChunkingConfig(max_tokens, overlap))
    covered = set()
    previous = None
    for chunk in chunks:
        assert 1 <= chunk.num_tokens <= max_tokens
        assert chunk.text == text[chunk.start_char:chunk.end_char]
        tokens = _token_range(spans, chunk)
        assert spans.offsets[tokens[-1]][1] == chunk.end_char
        covered.update(tokens)
        if previous is not None:
            assert tokens.start > previous.start  # always moves forward
            assert tokens.start <= previous.stop  # no gap
            assert previous.stop - tokens.start <= overlap  # shares at most `overlap` tokens
            assert spans.word_ids[tokens.start] != spans.word_ids[tokens.start - 1] or tokens.start == previous.stop
        previous = tokens
    assert covered == set(range(len(spans.offsets)))

"""Incremental detokenization and stop strings, with the real SmolLM2 tokenizer."""

import random

import pytest

from assembly.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from assembly.stop_strings import StopStringMatcher
from assembly.tokenizer import Tokenizer

TEXTS = [
    "Hello, world! This is plain ASCII.",
    "Emoji: 😀👍🏽 and a family 👨‍👩‍👧 — then ❤️ end",
    "日本語のテキストと中文文本，还有한국어도.",
    "Mixed: café naïve — 🎉🎉 深度学习 ok",
]


@pytest.fixture
def tokenizer(smollm2_tokenizer) -> Tokenizer:
    return smollm2_tokenizer  # conftest.py's, one per session


def _stream(tokenizer, token_ids, chunk_sizes=None) -> list[str]:
    """Push token_ids in chunks (default one by one); the deltas, then flush()."""
    detokenizer = IncrementalDetokenizer(tokenizer)
    deltas, i = [], 0
    for size in chunk_sizes or [1] * len(token_ids):
        deltas.append(detokenizer.push(token_ids[i:i + size]))
        i += size
    deltas.append(detokenizer.flush())
    return deltas


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_join_to_the_full_decode_and_never_split_a_character(tokenizer, text):
    token_ids = tokenizer.encode(text)
    deltas = _stream(tokenizer, token_ids)
    assert "".join(deltas) == tokenizer.decode(token_ids) == text
    assert not any(REPLACEMENT_CHAR in delta for delta in deltas)


def test_random_chunking_gives_the_same_text(tokenizer):
    rng = random.Random(0)
    text = " ".join(TEXTS)
    token_ids = tokenizer.encode(text)
    for _ in range(20):
        sizes, left = [], len(token_ids)
        while left:
            sizes.append(min(left, rng.randint(1, 4)))
            left -= sizes[-1]
        deltas = _stream(tokenizer, token_ids, sizes)
        assert "".join(deltas) == text
        assert not any(REPLACEMENT_CHAR in delta for delta in deltas)


def test_an_emoji_split_over_tokens_comes_out_whole_with_its_last_token(tokenizer):
    token_ids = tokenizer.encode("😀")
    assert len(token_ids) > 1  # the point of the test: one character, several tokens
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert [detokenizer.push([t]) for t in token_ids[:-1]] == [""] * (len(token_ids) - 1)
    assert detokenizer.push(token_ids[-1:]) == "😀"
    assert detokenizer.flush() == ""


def test_flush_releases_an_incomplete_character_as_replacement(tokenizer):
    token_ids = tokenizer.encode("ok 日")
    detokenizer = IncrementalDetokenizer(tokenizer)
    text = "".join(detokenizer.push([t]) for t in token_ids[:-1])
    assert text == "ok"
    assert detokenizer.flush().endswith(REPLACEMENT_CHAR)


def test_special_tokens_are_skipped(tokenizer):
    end = tokenizer.token_to_id("<|im_end|>")
    token_ids = tokenizer.encode("Bye") + [end]
    assert "".join(_stream(tokenizer, token_ids)) == "Bye"


# ---- stop strings ---------------------------------------------------------------------------


def _run_with_stops(tokenizer, text: str, stops: list[str]) -> tuple[str, bool, list[str]]:
    """Detokenize text's tokens one by one through a StopStringMatcher: (shown text, stopped, deltas)."""
    detokenizer, matcher = IncrementalDetokenizer(tokenizer), StopStringMatcher(stops)
    shown = []
    for token_id in tokenizer.encode(text):
        emitted, stopped = matcher.push(detokenizer.push([token_id]))
        shown.append(emitted)
        if stopped:
            return "".join(shown), True, shown
    emitted, stopped = matcher.push(detokenizer.flush())
    shown.append(emitted)
    if not stopped:
        shown.append(matcher.flush())
    return "".join(shown), stopped, shown


def test_stop_string_across_token_boundaries_is_not_emitted(tokenizer):
    text = "The answer is forty-two. END OF ANSWER and more text"
    stop = "END OF ANSWER"
    assert len(tokenizer.encode(stop)) > 1
    shown, stopped, deltas = _run_with_stops(tokenizer, text, [stop])
    assert stopped and shown == "The answer is forty-two. "
    assert not any("END" in delta for delta in deltas)


def test_the_earliest_stop_string_wins(tokenizer):
    shown, stopped, _ = _run_with_stops(tokenizer, "one two three four", ["four", "two"])
    assert stopped and shown == "one "


def test_a_partial_match_is_held_back_then_released(tokenizer):
    shown, stopped, deltas = _run_with_stops(tokenizer, "alpha beta gamma", ["beta version"])
    assert not stopped and shown == "alpha beta gamma"
    # "beta" could have started the stop string, so it was not shown with its own token.
    assert "alpha beta" not in "".join(deltas[:len(tokenizer.encode("alpha beta"))])


def test_held_text_is_flushed_at_the_end(tokenizer):
    shown, stopped, _ = _run_with_stops(tokenizer, "wait for it", ["it is over"])
    assert not stopped and shown == "wait for it"


def test_stop_strings_with_emoji_and_cjk(tokenizer):
    shown, stopped, deltas = _run_with_stops(tokenizer, "好的 👍🏽 谢谢你 再见", ["👍🏽 谢"])
    assert stopped and shown == "好的 "
    assert not any(REPLACEMENT_CHAR in delta for delta in deltas)


def test_matcher_unit_cases():
    matcher = StopStringMatcher(["abc"])
    assert matcher.push("xa") == ("x", False)
    assert matcher.push("b") == ("", False)
    assert matcher.push("d") == ("abd", False)
    assert matcher.push("zab") == ("z", False)
    assert matcher.push("cdef") == ("", True)
    assert matcher.push("more") == ("", True)

    matcher = StopStringMatcher([])
    assert matcher.push("abc") == ("abc", False) and matcher.flush() == ""
    with pytest.raises(ValueError):
        StopStringMatcher([""])

"""Token-aware chunking: cut a text into windows of at most `max_tokens` word-pieces that overlap.

Input is the text's word-pieces (`TokenSpans`: character offsets and word ids, from
`Embedder.token_spans`), so a chunk never exceeds what the embedder reads without
truncation. Invariants of `chunk_text`'s result:
  - every chunk has 1..max_tokens tokens, and its text is a slice of the original text
    (from its first token's start to its last token's end: the text between is kept as is);
  - chunks never split a word unless the word alone exceeds the window;
  - a chunk ends at a sentence end (., !, ?, newline) when one lies in the window's last quarter;
  - consecutive chunks share at most `overlap_tokens` tokens, whole words only, and always move forward;
  - together the chunks cover every token.
"""

from dataclasses import dataclass
from typing import NamedTuple

DEFAULT_CHUNK_TOKENS = 200
DEFAULT_OVERLAP_TOKENS = 32
_SENTENCE_ENDS = (".", "!", "?", "\n")


class TokenSpans(NamedTuple):
    offsets: list[tuple[int, int]]  # per token: [start, end) into the text
    word_ids: list[int]  # per token: its word's index


class Chunk(NamedTuple):
    text: str
    start_char: int
    end_char: int
    num_tokens: int


@dataclass(frozen=True)
class ChunkingConfig:
    max_tokens: int = DEFAULT_CHUNK_TOKENS
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"chunk tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.overlap_tokens < self.max_tokens:
            raise ValueError(f"overlap must be in [0, {self.max_tokens - 1}], got {self.overlap_tokens}")


def chunk_text(text: str, spans: TokenSpans, config: ChunkingConfig = ChunkingConfig()) -> list[Chunk]:
    offsets, word_ids = spans
    num_tokens = len(offsets)
    if num_tokens == 0:
        return []

    def starts_word(i: int) -> bool:
        return i == 0 or i == num_tokens or word_ids[i] != word_ids[i - 1]

    chunks = []
    start = 0
    while True:
        end = min(start + config.max_tokens, num_tokens)  # exclusive
        if end < num_tokens:
            end = _best_end(text, offsets, start, end, starts_word)
        chunks.append(Chunk(text[offsets[start][0]:offsets[end - 1][1]], offsets[start][0], offsets[end - 1][1],
                            end - start))
        if end == num_tokens:
            return chunks
        next_start = max(end - config.overlap_tokens, start + 1)
        while next_start < end and not starts_word(next_start):
            next_start += 1
        start = next_start


def _best_end(text: str, offsets: list[tuple[int, int]], start: int, end: int, starts_word) -> int:
    """Where a window [start, end) that does not reach the text's end should stop."""
    earliest_sentence_end = start + max(1, (end - start) * 3 // 4)
    for cut in range(end, earliest_sentence_end - 1, -1):
        if starts_word(cut) and _ends_sentence(text, offsets, cut):
            return cut
    for cut in range(end, start, -1):
        if starts_word(cut):
            return cut
    return end  # one word longer than the window: split it


def _ends_sentence(text: str, offsets: list[tuple[int, int]], cut: int) -> bool:
    """Whether token `cut - 1` closes a sentence (or a newline follows it)."""
    last_end = offsets[cut - 1][1]
    gap = text[last_end:offsets[cut][0]] if cut < len(offsets) else ""
    return text[last_end - 1:last_end] in _SENTENCE_ENDS or "\n" in gap

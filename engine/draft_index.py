"""Where draft tokens come from: token sequences indexed by their n-grams.

A `SequenceNgrams` indexes one growing sequence (a request's prompt + output) by
every n-gram of MIN_MATCH tokens, so prompt lookup costs O(candidates) per step, not
O(sequence). A `SuffixIndex` holds recent finished sequences across requests (prompts
and outputs), bounded in tokens; the oldest sequence leaves first and takes its index
entries with it. Both answer the same question: "where did the last tokens of this
sequence occur before, and what followed them?" as `Continuation`s; `choose_draft`
(engine/draft_proposer.py) walks them by match length and frequency.

Pure Python over token lists, no torch.
"""

from collections import deque
from dataclasses import dataclass, field

MIN_MATCH = 2  # an occurrence must repeat at least the last 2 tokens to propose anything
MAX_MATCH = 8  # match lengths are counted up to this many tokens
MAX_POSITIONS_PER_KEY = 8  # most recent occurrences kept per n-gram


@dataclass(frozen=True)
class Continuation:
    """An earlier occurrence of the query's last tokens: `tokens[start:]` followed them there."""

    tokens: list[int]
    start: int
    match_len: int  # how many of the query's last tokens it repeats (MIN_MATCH..MAX_MATCH)


def match_length(tokens: list[int], end: int, query: list[int]) -> int:
    """How many tokens before `end` in `tokens` equal the last tokens of `query` (at most MAX_MATCH)."""
    num = 0
    limit = min(MAX_MATCH, end, len(query))
    while num < limit and tokens[end - 1 - num] == query[len(query) - 1 - num]:
        num += 1
    return num


@dataclass
class SequenceNgrams:
    """One request's own tokens indexed by n-gram end position; `extend` as the sequence grows."""

    # n-gram of MIN_MATCH tokens -> end positions (exclusive) of its occurrences, oldest first
    positions: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    num_indexed: int = 0  # tokens[:num_indexed] are indexed

    def extend(self, tokens: list[int]) -> None:
        for end in range(max(self.num_indexed + 1, MIN_MATCH), len(tokens) + 1):
            key = tuple(tokens[end - MIN_MATCH:end])
            ends = self.positions.setdefault(key, [])
            ends.append(end)
            if len(ends) > 2 * MAX_POSITIONS_PER_KEY:
                del ends[:MAX_POSITIONS_PER_KEY]
        self.num_indexed = len(tokens)

    def continuations(self, tokens: list[int], ahead: list[int] = ()) -> list[Continuation]:
        """Earlier occurrences of the last tokens of tokens + ahead (not the last position itself).
        `ahead`: tokens known to come next (a grammar's forced ones), queried but not indexed."""
        self.extend(tokens)
        query = tokens + list(ahead) if ahead else tokens
        if len(query) < MIN_MATCH + 1:
            return []
        ends = self.positions.get(tuple(query[-MIN_MATCH:]), ())
        found = []
        for end in reversed(ends[-MAX_POSITIONS_PER_KEY - 1:]):
            if end >= len(tokens):
                continue  # the query itself
            found.append(Continuation(tokens, end, match_length(tokens, end, query)))
        return found


class SuffixIndex:
    """Recent finished sequences (prompt + output) of all requests, at most `max_tokens` in all.

    Sequences of different cache salts are kept apart (a tenant's drafts never come from
    another tenant's text, even though a draft only ever changes speed)."""

    def __init__(self, max_tokens: int):
        if max_tokens < 1:
            raise ValueError(f"a suffix index needs room for at least one token, got {max_tokens}")
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self._sequences: deque[tuple[int, object, list[int]]] = deque()  # (id, salt, tokens), oldest first
        self._by_id: dict[int, list[int]] = {}
        self._next_id = 0
        # (salt, n-gram) -> [(sequence id, end position)], oldest first
        self._positions: dict[tuple, list[tuple[int, int]]] = {}

    @property
    def num_sequences(self) -> int:
        return len(self._sequences)

    def add(self, tokens: list[int], salt=None) -> None:
        """Index a finished sequence; the oldest ones leave to stay within max_tokens."""
        tokens = list(tokens[-self.max_tokens:])
        if len(tokens) <= MIN_MATCH:
            return
        seq_id, self._next_id = self._next_id, self._next_id + 1
        self._sequences.append((seq_id, salt, tokens))
        self._by_id[seq_id] = tokens
        self.num_tokens += len(tokens)
        for end in range(MIN_MATCH, len(tokens)):  # an n-gram at the very end has no continuation
            entries = self._positions.setdefault((salt, tuple(tokens[end - MIN_MATCH:end])), [])
            entries.append((seq_id, end))
            if len(entries) > MAX_POSITIONS_PER_KEY:
                del entries[0]
        while self.num_tokens > self.max_tokens:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        seq_id, salt, tokens = self._sequences.popleft()
        del self._by_id[seq_id]
        self.num_tokens -= len(tokens)
        for end in range(MIN_MATCH, len(tokens)):
            key = (salt, tuple(tokens[end - MIN_MATCH:end]))
            entries = self._positions.get(key)
            if entries is None:
                continue
            entries[:] = [entry for entry in entries if entry[0] != seq_id]
            if not entries:
                del self._positions[key]

    def continuations(self, query: list[int], salt=None) -> list[Continuation]:
        if len(query) < MIN_MATCH:
            return []
        found = []
        for seq_id, end in reversed(self._positions.get((salt, tuple(query[-MIN_MATCH:])), ())):
            tokens = self._by_id[seq_id]
            found.append(Continuation(tokens, end, match_length(tokens, end, query)))
        return found

"""Where a prompt's reusable document spans are: content-defined chunks over token ids.

A document (or any pasted passage) may sit at a different offset, after different text, in
every prompt. Its KV is stored per span, keyed by the span's token ids, so the spans must be
cut by the tokens themselves, never by offsets: the same passage in two prompts must give the
same spans inside it, and only the partial chunks at its two edges may differ.

The prompt is first cut into regions at every exact span's start and end, so no span crosses an
exact span and each exact span is chunked as if it stood alone. In a region:

1. Candidates: a cut between tokens p - 1 and p, each with a strength (SpanBreaks says which
   token ids are newlines, paragraph breaks and special tokens; without one only level 1 exists):
     5  before a special token that ends a text (`...text|<|im_end|>`)
     4  after the newline that opens a message's text (a special token among the 3 before it)
     3  before a paragraph break (a blank line)
     2  before a newline
     1  a gear hash (FastCDC's: h = (h << 1) + gear(token), kept to 16 bits, so its top bits
        depend on the last 16 tokens only) with its top 6 bits zero: one every ~64 tokens
   So a pasted document, which sits between paragraph breaks or message edges, is cut at its
   own edges, and its inside by its own lines and tokens.
2. Kept cuts: levels 4-5 always (message edges); a cut of level 1-3 is kept when no cut of level
   1-3 within _MIN_CHUNK_TOKENS of it is stronger (level, then hash, then the later one). The
   decision reads only the tokens around a cut, so it is as content-defined as the candidates;
   kept cuts of one level are >= _MIN_CHUNK_TOKENS apart, and a short piece between cuts of
   two levels is simply not a span.
3. Long chunks: a chunk longer than _MAX_CHUNK_TOKENS is cut every _MAX_CHUNK_TOKENS tokens from
   its start (a cut that is content-defined itself), the last piece taking a remainder shorter
   than _MIN_CHUNK_TOKENS.

In an exact span no cut falls within _MIN_CHUNK_TOKENS of its edges, so a document of fewer
than 128 tokens is one span and none loses a short head or tail. Spans shorter than
`min_span_tokens` are dropped. Pure Python over a list, O(n).
"""

from collections.abc import Sequence
from dataclasses import dataclass

_MIN_CHUNK_TOKENS = 64
_MAX_CHUNK_TOKENS = 256
_HASH_BITS = 16
_HASH_MASK = (1 << _HASH_BITS) - 1
_CANDIDATE_BITS = 5  # one level-1 candidate every ~32 tokens
# the top _CANDIDATE_BITS bits of the 16-bit hash: each depends on the last 11-16 tokens
_CANDIDATE_MASK = ((1 << _CANDIDATE_BITS) - 1) << (_HASH_BITS - _CANDIDATE_BITS)
_GEAR_MULTIPLIER = 2654435761  # Knuth's: bits 16-31 of id * this mix all of the id's low 32 bits
_MESSAGE_START_WINDOW = 3  # a newline with a special token this close before it opens a message
_ALWAYS_KEPT_LEVEL = 4


@dataclass(frozen=True)
class SpanBreaks:
    """Token ids the cuts prefer, from the model's tokenizer (engine/span_breaks.py)."""

    newline_ids: frozenset[int] = frozenset()  # tokens whose text holds a newline
    paragraph_ids: frozenset[int] = frozenset()  # tokens whose text holds a blank line ("\n\n")
    special_ids: frozenset[int] = frozenset()  # the template's special tokens (<|im_end|>, ...)


NO_BREAKS = SpanBreaks()


def find_spans(
    token_ids: Sequence[int], exact_spans: Sequence[tuple[int, int]] = (), min_span_tokens: int = 64,
    breaks: SpanBreaks = NO_BREAKS,
) -> list[tuple[int, int]]:
    """Sorted, non-overlapping [start, end) ranges of `token_ids` worth storing as document KV.

    `exact_spans` (sorted or not, non-overlapping, within the prompt) are hard boundaries: no
    span crosses one's start or end, and inside one the content-defined cuts apply as anywhere.
    """
    region_edges, exact_starts = _region_edges(len(token_ids), exact_spans)
    spans = []
    for region_start, region_end in zip(region_edges, region_edges[1:]):
        margin = _MIN_CHUNK_TOKENS if region_start in exact_starts else 1
        for start, end in _chunks(token_ids, region_start, region_end, margin, breaks):
            if end - start >= min_span_tokens:
                spans.append((start, end))
    return spans


def _region_edges(num_tokens: int, exact_spans: Sequence[tuple[int, int]]) -> tuple[list[int], set[int]]:
    """(0, every exact span's start and end, num_tokens: sorted, without repeats; the starts)."""
    edges = [0]
    previous_end = 0
    for start, end in sorted(exact_spans):
        if not 0 <= start < end <= num_tokens:
            raise ValueError(f"exact span [{start}, {end}) is not inside a prompt of {num_tokens} tokens")
        if start < previous_end:
            raise ValueError(f"exact span [{start}, {end}) overlaps the one before it")
        edges.extend((start, end))
        previous_end = end
    edges.append(num_tokens)
    return sorted(set(edges)), {start for start, _ in exact_spans}


def _chunks(token_ids: Sequence[int], region_start: int, region_end: int, margin: int, breaks: SpanBreaks):
    """The chunks [start, end) that tile [region_start, region_end)."""
    # Candidates within the margin are no cuts, but still beat weaker ones near them: the kept
    # cuts of an exact span are then those of the same text pasted, less the ones near its edges.
    kept = _kept_cuts(_candidates(token_ids, region_start, region_end, breaks))
    cuts = [region_start, *(p for p in kept if region_start + margin <= p <= region_end - margin), region_end]
    for start, end in zip(cuts, cuts[1:]):
        while end - start > _MAX_CHUNK_TOKENS:
            if end - start - _MAX_CHUNK_TOKENS < _MIN_CHUNK_TOKENS:
                break  # the remainder joins this piece
            yield start, start + _MAX_CHUNK_TOKENS
            start += _MAX_CHUNK_TOKENS
        yield start, end


def _candidates(token_ids: Sequence[int], region_start: int, region_end: int,
                breaks: SpanBreaks) -> list[tuple[int, int, int]]:
    """(level, hash, p) of each candidate cut p (region_start < p < region_end), in order of p.
    The hash restarts at the region's start, so an exact span's candidates are its own."""
    newline_ids, paragraph_ids, special_ids = breaks.newline_ids, breaks.paragraph_ids, breaks.special_ids
    candidates = []
    hash_value = 0
    for index in range(region_start, region_end - 1):
        token_id, next_id = token_ids[index], token_ids[index + 1]
        hash_value = ((hash_value << 1) + (((token_id * _GEAR_MULTIPLIER) >> _HASH_BITS) & _HASH_MASK)) & _HASH_MASK
        if next_id in special_ids and token_id not in special_ids and token_id not in newline_ids:
            level = 5
        elif token_id in newline_ids and any(
                t in special_ids for t in token_ids[max(region_start, index - _MESSAGE_START_WINDOW):index]):
            level = 4
        elif next_id in newline_ids and token_id not in newline_ids:
            is_blank_line = next_id in paragraph_ids or (index + 2 < region_end and token_ids[index + 2] in newline_ids)
            level = 3 if is_blank_line else 2
        elif not hash_value & _CANDIDATE_MASK:
            level = 1
        else:
            continue
        candidates.append((level, hash_value, index + 1))
    return candidates


def _kept_cuts(candidates: list[tuple[int, int, int]]) -> list[int]:
    """The candidates kept by rule 2 of the module docstring, as positions."""
    kept = []
    for i, candidate in enumerate(candidates):
        level, _, position = candidate
        if level >= _ALWAYS_KEPT_LEVEL or not _is_beaten(candidates, i):
            kept.append(position)
    return kept


def _is_beaten(candidates: list[tuple[int, int, int]], i: int) -> bool:
    """A candidate of level 1-3 within _MIN_CHUNK_TOKENS of candidates[i] is stronger."""
    candidate = candidates[i]
    position = candidate[2]
    for step in (-1, 1):
        j = i + step
        while 0 <= j < len(candidates) and abs(candidates[j][2] - position) < _MIN_CHUNK_TOKENS:
            other = candidates[j]
            if other[0] < _ALWAYS_KEPT_LEVEL and other > candidate:
                return True
            j += step
    return False

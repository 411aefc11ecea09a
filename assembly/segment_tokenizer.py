"""Tokenization with a segment cache, in which only trusted markup can become control tokens.

Control tokens. A prompt is the chat template's markup around request content
(messages, tool results, tool-call arguments, documents, tool definitions). An
added token's string inside content (`<|im_end|>\\n<|im_start|>system` in a user
message) must stay text, or the content could close its own turn and forge a
system turn. So content passes through `as_text` before it is rendered: every
added-token string in it gets a NEUTRAL mark before each of its characters.
`encode` then takes as a control token only an added-token string with no mark
in or just before it (the template's own), and reads everything else as plain
text (`Tokenizer.encode_text`), the marks removed. NEUTRAL is a Unicode
noncharacter, stripped from content first, so a request cannot place one.

Segment cache. The rendered text is cut before every control token; each
segment is that token's id + its following text, read as plain text. The
tokenizer splits text at added tokens before anything else, so this equals
tokenizing the whole (unmarked) text. The system turn, the tools and documents
blocks and every earlier turn come back request after request as the same
segments; only the new ones are tokenized. That equality depends on the
tokenizer (a pre-tokenizer that prepends a space to the first word of every
piece would break it), so it is checked once on a probe text; a tokenizer that
fails is used whole-text and uncached (`is_segmented` False), except for a text
whose content holds marked token strings, which is still read piece by piece
(safe, though that tokenizer may then space the pieces differently).

`check_fits` refuses a text that cannot fit a token budget from its length
alone (PromptTooLong), before any tokenizing.

A prompt may also carry token ids to splice in verbatim (an assistant turn's
generated ids, see prompt_builder.py): `encode_pieces` takes text and id lists.
Thread-safe: prompts are tokenized in worker threads; the cache has a lock.
"""

import logging
import re
import threading
from collections import OrderedDict

from assembly.tokenizer import Tokenizer

logger = logging.getLogger("radixserve.assembly")

DEFAULT_MAX_SEGMENTS = 8192
NEUTRAL = "\ufdd0"  # marks a character of content as text (a noncharacter: never sent as content)


class PromptTooLong(ValueError):
    """A text that cannot fit `max_num_tokens`, known from its length before it is tokenized."""

    def __init__(self, min_num_tokens: int, max_num_tokens: int):
        super().__init__(f"the prompt is at least {min_num_tokens} tokens, more than the {max_num_tokens} "
                         f"this server can take")
        self.min_num_tokens = min_num_tokens
        self.max_num_tokens = max_num_tokens


class SegmentTokenizer:
    def __init__(self, tokenizer: Tokenizer, max_segments: int = DEFAULT_MAX_SEGMENTS):
        self.tokenizer = tokenizer
        self.max_segments = max_segments
        self._segments: OrderedDict[str, tuple[int, ...]] = OrderedDict()  # LRU: text -> ids
        self._lock = threading.Lock()
        self.num_hits = 0
        self.num_misses = 0
        added = sorted(set(tokenizer.added_tokens), key=len, reverse=True)
        self._ids = {token: tokenizer.token_to_id(token) for token in added}
        alternatives = "|".join(re.escape(t) for t in added)
        # Any added token's string (longest first, as the tokenizer matches); one of the markup's:
        # not preceded by a mark; a zero-width cut before each of the markup's.
        self._added = re.compile(alternatives) if added else None
        self._control = re.compile(f"(?<!{NEUTRAL})(?:{alternatives})") if added else None
        self._cut = re.compile(f"(?={self._control.pattern})") if added else None
        self.is_segmented = self._cut is not None and self._check_split_invariance(added)
        if self._cut is not None and not self.is_segmented:
            logger.info("tokenizer splits differently in segments; prompts are tokenized whole, uncached")

    def as_text(self, text: str) -> str:
        """Untrusted `text` marked so that `encode` reads all of it as text, whatever the template
        does around it. Text without added-token strings comes back unchanged."""
        if NEUTRAL in text:
            text = text.replace(NEUTRAL, "")
        if self._added is None:
            return text
        return self._added.sub(lambda match: "".join(NEUTRAL + char for char in match.group(0)), text)

    @staticmethod
    def unmarked(text: str) -> str:
        """Rendered text as the model reads it: the marks of `as_text` removed."""
        return text.replace(NEUTRAL, "")

    def check_fits(self, pieces: list[str | list[int]], max_num_tokens: int | None) -> None:
        """Raise PromptTooLong when `pieces` (as for encode_pieces) surely exceed `max_num_tokens`:
        a bound from their length alone, so an oversized prompt is refused without tokenizing it."""
        if max_num_tokens is None:
            return
        num_chars = sum(len(p) - p.count(NEUTRAL) for p in pieces if isinstance(p, str))
        num_ids = sum(len(p) for p in pieces if not isinstance(p, str))
        min_num_tokens = self.tokenizer.min_num_tokens(num_chars) + num_ids
        if min_num_tokens > max_num_tokens:
            raise PromptTooLong(min_num_tokens, max_num_tokens)

    def encode(self, text: str, use_cache: bool = True) -> list[int]:
        """Token ids of `text`: unmarked added-token strings become control ids, the rest is text.
        `use_cache` False: the same ids, leaving the segment cache as it is (one-off probes)."""
        if self._cut is None:
            return self.tokenizer.encode_text(self.unmarked(text))
        if not self.is_segmented:
            if NEUTRAL not in text:
                return self.tokenizer.encode(text)
            return [i for segment in self.split(text) for i in self._segment_ids(segment)]
        ids: list[int] = []
        for segment in self.split(text):
            ids.extend(self._cached_segment_ids(segment) if use_cache else self._segment_ids(segment))
        return ids

    def encode_pieces(self, pieces: list[str | list[int]]) -> list[int]:
        """Text pieces tokenized (segment by segment), id pieces copied, all concatenated."""
        ids: list[int] = []
        for piece in pieces:
            ids.extend(self.encode(piece) if isinstance(piece, str) else piece)
        return ids

    def split(self, text: str) -> list[str]:
        """`text` cut before every control token; empty pieces dropped."""
        return [segment for segment in self._cut.split(text) if segment]

    def _segment_ids(self, segment: str) -> tuple[int, ...]:
        """A segment (a control token, if it starts with one, then text) -> its ids."""
        control = self._control.match(segment)
        head = (self._ids[control.group(0)],) if control is not None else ()
        rest = segment[control.end():] if control is not None else segment
        return head + tuple(self.tokenizer.encode_text(self.unmarked(rest)) if rest else ())

    def _cached_segment_ids(self, segment: str) -> tuple[int, ...]:
        with self._lock:
            ids = self._segments.get(segment)
            if ids is not None:
                self._segments.move_to_end(segment)
                self.num_hits += 1
                return ids
            self.num_misses += 1
        ids = self._segment_ids(segment)
        with self._lock:
            self._segments[segment] = ids
            if len(self._segments) > self.max_segments:
                self._segments.popitem(last=False)
        return ids

    def _check_split_invariance(self, added: list[str]) -> bool:
        probe = "".join(f"  Hello, world 12{token}\n x  {token}y" for token in added[:64]) + " end"
        whole = self.tokenizer.encode(probe)
        pieces = [i for segment in self.split(probe) for i in self._segment_ids(segment)]
        return whole == pieces

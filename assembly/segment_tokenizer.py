"""Tokenization with a segment cache: a prompt's stable parts are tokenized once.

A rendered prompt is cut before every added token (`<|im_start|>` ...): the
tokenizer splits text at added tokens before anything else, so each segment
tokenizes on its own to exactly its share of the whole, and concatenating the
segments' ids equals tokenizing the whole text. The system turn, the tools and
documents blocks and every earlier turn come back request after request as
the same segments; only the new ones are tokenized.

That equality depends on the tokenizer (a pre-tokenizer that prepends a space
to the first word of every piece would break it), so it is checked once on a
probe text when the tokenizer is wrapped; a tokenizer that fails the check is
used whole-text, uncached, and says so in `is_segmented`.

A prompt may also carry token ids to splice in verbatim (an assistant turn's
generated ids, see prompt_builder.py): `encode_pieces` takes text and id lists.
"""

import logging
import re
from collections import OrderedDict

from assembly.tokenizer import Tokenizer

logger = logging.getLogger("radixserve.assembly")

DEFAULT_MAX_SEGMENTS = 8192


class SegmentTokenizer:
    def __init__(self, tokenizer: Tokenizer, max_segments: int = DEFAULT_MAX_SEGMENTS):
        self.tokenizer = tokenizer
        self.max_segments = max_segments
        self._segments: OrderedDict[str, tuple[int, ...]] = OrderedDict()  # LRU: text -> ids
        self.num_hits = 0
        self.num_misses = 0
        added = sorted(set(tokenizer.added_tokens), key=len, reverse=True)
        # A zero-width cut before each added token.
        self._cut = re.compile("(?=" + "|".join(re.escape(t) for t in added) + ")") if added else None
        self.is_segmented = self._cut is not None and self._check_split_invariance(added)
        if self._cut is not None and not self.is_segmented:
            logger.info("tokenizer splits differently in segments; prompts are tokenized whole, uncached")

    def encode(self, text: str) -> list[int]:
        if not self.is_segmented:
            return self.tokenizer.encode(text)
        ids: list[int] = []
        for segment in self.split(text):
            ids.extend(self._encode_segment(segment))
        return ids

    def encode_pieces(self, pieces: list[str | list[int]]) -> list[int]:
        """Text pieces tokenized (segment by segment), id pieces copied, all concatenated."""
        ids: list[int] = []
        for piece in pieces:
            ids.extend(self.encode(piece) if isinstance(piece, str) else piece)
        return ids

    def split(self, text: str) -> list[str]:
        """`text` cut before every added token; empty pieces dropped."""
        return [segment for segment in self._cut.split(text) if segment]

    def _encode_segment(self, segment: str) -> tuple[int, ...]:
        ids = self._segments.get(segment)
        if ids is not None:
            self._segments.move_to_end(segment)
            self.num_hits += 1
            return ids
        self.num_misses += 1
        ids = tuple(self.tokenizer.encode(segment))
        self._segments[segment] = ids
        if len(self._segments) > self.max_segments:
            self._segments.popitem(last=False)
        return ids

    def _check_split_invariance(self, added: list[str]) -> bool:
        probe = "".join(f"  Hello, world 12{token}\n x  {token}y" for token in added[:64]) + " end"
        whole = self.tokenizer.encode(probe)
        pieces = [i for segment in self.split(probe) for i in self.tokenizer.encode(segment)]
        return whole == pieces

"""Incremental detokenization: token ids in, text deltas out, never a broken character.

A byte-level BPE token can end in the middle of a UTF-8 character (an emoji
or a CJK character often spans two or three tokens); decoding such a prefix
yields U+FFFD. The detokenizer decodes a short window of recent tokens and
holds text back while it ends in U+FFFD, so every delta it returns is whole
characters, and the concatenation of all deltas plus `flush()` equals the
decode of all the tokens at once.

Window invariant: `token_ids[prefix_offset:read_offset]` decodes to text that
was already returned and ends on a character boundary. Decoding from
`prefix_offset` (the previous delta's tokens) rather than from the very start
keeps each step O(window); keeping those tokens as left context keeps decoders
that treat a sequence's first token specially (leading-space handling)
consistent with a full decode.
"""

from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self._prefix_offset = 0  # start of the decode window
        self._read_offset = 0  # tokens before this were turned into returned text

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the new text that is complete (may be "")."""
        self.token_ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character decodes to U+FFFD here)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read_offset == len(self.token_ids):
            return ""
        emitted = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
        window = self._decode(self.token_ids[self._prefix_offset:])
        if len(window) <= len(emitted) and not final:
            return ""
        if window.endswith(REPLACEMENT_CHAR) and not final:
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.token_ids)
        return window[len(emitted):]

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)

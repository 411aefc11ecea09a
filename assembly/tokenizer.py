"""The model's tokenizer (a `tokenizers` tokenizer.json) and its special ids.

Two encodings: `encode` reads added-token strings (`<|im_end|>` ...) as their
ids, which only trusted text may do (a chat template's markup, a raw
completions prompt); `encode_text` reads every character as text, so the same
string becomes ordinary tokens. The latter is a second `tokenizers` instance
without added tokens: same normalizer, pre-tokenizer and model, so text with
no added-token string in it encodes the same either way.

A long text is encoded through `encode_batch`, which releases the GIL (plain
`encode` holds it: seconds for a megabyte), so a worker thread tokenizing a
huge prompt does not stall the event loop.

Parsing a tokenizer.json takes ~0.5 s (two instances of a 49k-entry vocabulary); a process parses
each file once (`_parsed`, keyed by the file's path, size and modification time): the instances are
never changed after parsing, and `tokenizers` encodes on one instance from many threads.
"""

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

_LONG_TEXT_CHARS = 4096  # longer texts are encoded with the GIL released


class Tokenizer:
    def __init__(self, model_dir: Path):
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing")
        self.path = path
        stat = path.stat()
        parsed = _parsed(path.resolve(), stat.st_size, stat.st_mtime_ns)
        self._tokenizer, self._text_tokenizer = parsed.tokenizer, parsed.text_tokenizer
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.max_token_chars = parsed.max_token_chars
        self._shrink_margin = 1 if self._tokenizer.normalizer is None else 4

    def min_num_tokens(self, num_chars: int) -> int:
        """A lower bound on the tokens of any text of `num_chars` characters (checked before encoding)."""
        return num_chars // (self.max_token_chars * self._shrink_margin)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it become their ids, and
        nothing (no BOS) is added: chat templates write their own."""
        return _encode(self._tokenizer, text)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of `text` read as plain text: an added token's string becomes ordinary tokens."""
        return _encode(self._text_tokenizer, text)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    @property
    def added_tokens(self) -> list[str]:
        """The added tokens' strings (special or not): `encode` splits text at each of them first."""
        return [token.content for token in self._tokenizer.get_added_tokens_decoder().values()]


@dataclass(frozen=True)
class _ParsedTokenizer:
    tokenizer: HFTokenizer  # reads added-token strings as their ids
    text_tokenizer: HFTokenizer  # the same without added tokens
    # A token covers at most this many characters of text (a byte-level token's string has one
    # character per byte), unless a normalizer shrinks the text first (NFC composes up to 3 into 1).
    max_token_chars: int


@functools.lru_cache(maxsize=8)
def _parsed(path: Path, size: int, mtime_ns: int) -> _ParsedTokenizer:
    """tokenizer.json at `path` parsed; size and mtime_ns make a rewritten file a new entry."""
    source = path.read_text()
    tokenizer = HFTokenizer.from_str(source)
    text_tokenizer = HFTokenizer.from_str(json.dumps({**json.loads(source), "added_tokens": []}))
    max_token_chars = max(len(token) for token in tokenizer.get_vocab(with_added_tokens=True))
    return _ParsedTokenizer(tokenizer, text_tokenizer, max_token_chars)


def _encode(tokenizer: HFTokenizer, text: str) -> list[int]:
    if len(text) > _LONG_TEXT_CHARS:
        return tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
    return tokenizer.encode(text, add_special_tokens=False).ids

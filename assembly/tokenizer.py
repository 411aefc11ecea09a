"""The model's tokenizer (a `tokenizers` tokenizer.json) and its special ids.

Two encodings: `encode` reads added-token strings (`<|im_end|>` ...) as their
ids, which only trusted text may do (a chat template's markup, a raw
completions prompt); `encode_text` reads every character as text, so the same
string becomes ordinary tokens. The latter is a second `tokenizers` instance
without added tokens: same normalizer, pre-tokenizer and model, so text with
no added-token string in it encodes the same either way.
"""

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer


class Tokenizer:
    def __init__(self, model_dir: Path):
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing")
        self.path = path
        source = path.read_text()
        self._tokenizer = HFTokenizer.from_str(source)
        self._text_tokenizer = HFTokenizer.from_str(json.dumps({**json.loads(source), "added_tokens": []}))
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it become their ids, and
        nothing (no BOS) is added: chat templates write their own."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_text(self, text: str) -> list[int]:
        """Token ids of `text` read as plain text: an added token's string becomes ordinary tokens."""
        return self._text_tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    @property
    def added_tokens(self) -> list[str]:
        """The added tokens' strings (special or not): `encode` splits text at each of them first."""
        return [token.content for token in self._tokenizer.get_added_tokens_decoder().values()]

"""Token logprobs in OpenAI's two formats: chat (`content` entries) and legacy completions.

A token's text is its own decode; `bytes` are that text's UTF-8, so a token that
holds only part of a character shows U+FFFD (a byte-level vocabulary lookup
would give the raw bytes; the tokenizer wrapper does not expose one yet).
"""

from functools import lru_cache

from assembly.tokenizer import Tokenizer


class LogprobFormatter:
    def __init__(self, tokenizer: Tokenizer):
        self._token_text = lru_cache(maxsize=65536)(
            lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False))

    def _entry(self, token_id: int, logprob: float) -> dict:
        text = self._token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def chat(self, token_ids: list[int], logprobs: list[float],
             top_logprobs: list[list[tuple[int, float]]] | None) -> dict:
        """{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}"""
        content = []
        for i, (token_id, logprob) in enumerate(zip(token_ids, logprobs)):
            alternatives = top_logprobs[i] if top_logprobs else []
            entry = self._entry(token_id, logprob)
            entry["top_logprobs"] = [self._entry(t, lp) for t, lp in alternatives]
            content.append(entry)
        return {"content": content}

    def completion(self, token_ids: list[int], logprobs: list[float],
                   top_logprobs: list[list[tuple[int, float]]] | None, text_offset: int = 0) -> dict:
        """{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}; an echoed
        prompt's first token has logprob None and top_logprobs None."""
        tokens, offsets = [], []
        for token_id in token_ids[:len(logprobs)]:
            text = self._token_text(token_id)
            tokens.append(text)
            offsets.append(text_offset)
            text_offset += len(text)
        tops = [None if alternatives is None else {self._token_text(t): lp for t, lp in alternatives}
                for alternatives in (top_logprobs or [])]  # None: an echoed prompt's first token
        return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": tops or None,
                "text_offset": offsets}

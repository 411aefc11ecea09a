"""A `tokenizers.Tokenizer` rebuilt from a GGUF file's tokenizer metadata.

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary, merges, token
kinds and special ids as metadata (`tokenizer.ggml.*`). This rebuilds the
tokenizer those describe so that it gives the same ids as transformers' own
GGUF loading (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`), which the
tests hold it to.

Two kinds of vocabulary:
- byte-level BPE (`tokenizer.ggml.model == "gpt2"`: SmolLM, Llama 3, Qwen2/3,
  Phi-4-mini, ...), split first by the regex of the pre-tokenizer llama.cpp names;
- SentencePiece BPE (`"llama"`: Gemma 2/3, Phi-3, Llama 2, Mistral v0.1), rebuilt
  as HF's own SentencePiece converter does (store/gguf_spm_tokenizer.py).
Any other kind is refused rather than guessed at.

For `tokenizer.ggml.pre == "smollm"` digits are isolated first
(`Digits(individual_digits=True)`), as SmolLM2's own tokenizer.json and llama.cpp do:
that is how the model was trained. transformers (5.x) has no "smollm" entry and
falls back to the plain GPT-2 split, which differs wherever two or more whitespace
characters precede a digit ("\\n\\n1." is [ĊĊ, 1, .] here and in SmolLM2, [Ċ, Ċ, 1, .]
in transformers' GGUF loading) and where a space precedes a non-ASCII numeral.
"""

from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

from store.errors import ModelFormatError
from store.gguf_spm_tokenizer import build_spm_tokenizer

# llama.cpp's token kinds (`tokenizer.ggml.token_type`).
TOKEN_TYPE_CONTROL = 3  # special tokens like <|im_start|>: matched whole, skipped when decoding
TOKEN_TYPE_USER_DEFINED = 4  # added tokens like <think>: matched whole, decoded as text

# Llama 3's split, as in its tokenizer.json (llama.cpp "llama-bpe").
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's split: like Llama 3's but one digit per piece.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GPT-4o's split (Phi-4-mini), as in its tokenizer.json (llama.cpp "gpt-4o").
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Mistral's Tekken split (Mistral Nemo, Ministral), as in its tokenizer.json (llama.cpp "tekken").
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# None: GPT-2's own regex, built into `pre_tokenizers.ByteLevel(use_regex=True)`.
_SPLIT_BY_PRE: dict[str, str | None] = {
    "default": None,
    "gpt2": None,
    "gpt-2": None,
    "smollm": None,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "gpt-4o": _GPT4O_SPLIT,
    "tekken": _TEKKEN_SPLIT,
}


def build_tokenizer(metadata: Mapping[str, Any], source: str | Path) -> Tokenizer:
    """The tokenizer `metadata` (a GGUF's key/value pairs) describes.

    `source` names the file in errors. Raises ModelFormatError for a tokenizer
    kind or pre-tokenizer this module does not know.
    """
    tokenizer_model = metadata.get("tokenizer.ggml.model")
    if tokenizer_model == "llama":
        tokenizer = build_spm_tokenizer(metadata, source)
        post_processor = post_processor_for(metadata, metadata["tokenizer.ggml.tokens"])
        if post_processor is not None:
            tokenizer.post_processor = post_processor
        return tokenizer
    if tokenizer_model != "gpt2":
        raise ModelFormatError(
            source, f"tokenizer model {tokenizer_model!r} is not supported "
                    "(byte-level BPE 'gpt2', SentencePiece 'llama')"
        )
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in _SPLIT_BY_PRE:
        raise ModelFormatError(source, f"pre-tokenizer {pre!r} is not supported (known: {sorted(_SPLIT_BY_PRE)})")
    token_strs: Sequence[str] = metadata["tokenizer.ggml.tokens"]
    token_types: Sequence[int] = metadata.get("tokenizer.ggml.token_type") or ()
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is None:
        raise ModelFormatError(source, "byte-level BPE tokenizer has no tokenizer.ggml.merges")

    tokenizer = Tokenizer(
        BPE(
            vocab=_byte_level_vocab(token_strs),
            merges=[tuple(merge.split(" ", 1)) for merge in merges],
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            # Llama 3's tokenizer.json takes a piece found whole in the vocabulary as is
            ignore_merges=_SPLIT_BY_PRE[pre] is _LLAMA3_SPLIT,
        )
    )
    tokenizer.pre_tokenizer = _pre_tokenizer(pre, bool(metadata.get("tokenizer.ggml.add_space_prefix", False)))
    tokenizer.decoder = decoders.ByteLevel()
    _add_special_tokens(tokenizer, token_strs, token_types)
    post_processor = post_processor_for(metadata, token_strs)
    if post_processor is not None:
        tokenizer.post_processor = post_processor
    return tokenizer


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (each of the 256 bytes has one char)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    byte_to_char = {b: chr(b) for b in printable}
    next_free = 256
    for b in range(256):
        if b not in byte_to_char:
            byte_to_char[b] = chr(next_free)
            next_free += 1
    return byte_to_char


def _byte_level_vocab(token_strs: Sequence[str]) -> dict[str, int]:
    """token -> id, with any token not already in the byte alphabet re-spelled into it.

    A byte-level vocabulary stores every token in GPT-2's byte alphabet; the few
    files that store one in plain UTF-8 get it re-spelled, as transformers does.
    """
    byte_to_char = _byte_alphabet()
    alphabet = set(byte_to_char.values())
    vocab = {}
    for token_id, token in enumerate(token_strs):
        if not set(token) <= alphabet:
            token = "".join(byte_to_char[b] for b in token.encode("utf-8"))
        vocab[token] = token_id
    return vocab


def _pre_tokenizer(pre: str, add_prefix_space: bool) -> pre_tokenizers.PreTokenizer:
    if pre == "smollm":
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True),
            ]
        )
    split = _SPLIT_BY_PRE[pre]
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _add_special_tokens(tokenizer: Tokenizer, token_strs: Sequence[str], token_types: Sequence[int]) -> None:
    """Control tokens become special added tokens, user-defined ones plain added tokens.

    Either kind must be added or it would be cut into byte pieces. A control token
    spelled outside the byte alphabet is a llama.cpp mislabel and is left out
    (transformers does the same; adding it would grow the vocabulary).
    """
    alphabet = set(_byte_alphabet().values())
    # control tokens first (special), then user-defined ones (plain added tokens)
    for wanted_kind, is_special, add in ((TOKEN_TYPE_CONTROL, True, tokenizer.add_special_tokens),
                                         (TOKEN_TYPE_USER_DEFINED, False, tokenizer.add_tokens)):
        added = [AddedToken(token, normalized=False, special=is_special)
                 for token, kind in zip(token_strs, token_types) if kind == wanted_kind and set(token) <= alphabet]
        if added:
            add(added)


def post_processor_for(metadata: Mapping[str, Any], token_strs: Sequence[str]) -> processors.PostProcessor | None:
    """BOS / EOS around each encoded text, where the file asks for them."""
    parts: dict[str, tuple[str, int]] = {}
    for flag, key in (("add_bos_token", "bos"), ("add_eos_token", "eos")):
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if metadata.get(f"tokenizer.ggml.{flag}", False) and token_id is not None:
            parts[key] = (token_strs[token_id], token_id)
    if not parts:
        return None
    bos = [parts["bos"][0]] if "bos" in parts else []
    eos = [parts["eos"][0]] if "eos" in parts else []
    return processors.TemplateProcessing(
        single=" ".join(bos + ["$A"] + eos),
        pair=" ".join(bos + ["$A"] + eos + bos + ["$B:1"] + eos),
        special_tokens=list(parts.values()),
    )


def special_token_str(metadata: Mapping[str, Any], key: str) -> str | None:
    """The text of the special token `key` ("bos", "eos", "unknown", "padding"), if the file names one."""
    token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
    if token_id is None:
        return None
    return metadata["tokenizer.ggml.tokens"][token_id]

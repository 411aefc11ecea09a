"""A SentencePiece-BPE vocabulary from GGUF metadata (`tokenizer.ggml.model == "llama"`) as a
`tokenizers.Tokenizer`: Gemma 2/3, Phi-3, Llama 2, Mistral v0.1.

llama.cpp stores the pieces (with "▁" for space, byte pieces "<0x0A>"), their scores and
kinds. Rebuilt here as transformers builds these tokenizers from a tokenizer.model: a BPE with
byte fallback whose merges are every split of a piece into two pieces, ranked by the merged
piece's score (SentencePiece merges the best-scored pair first), control pieces as special added tokens,
user-defined ones as plain added tokens. Spaces become "▁"; with
`tokenizer.ggml.add_space_prefix` (llama.cpp's default for this kind; Gemma writes false) a
"▁" is prepended to each run of text, after a special token too, as llama.cpp and the
families' own tokenizer.json (Phi-3, Llama 2: `Prepend` normalizer) do.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, normalizers
from tokenizers.models import BPE

from store.errors import ModelFormatError

SPACE_PIECE = "▁"
# llama.cpp's token kinds (`tokenizer.ggml.token_type`)
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
# Phi-3's chat tokens swallow the whitespace after them (rstrip) in its tokenizer.json; llama.cpp
# sets the same by name for phi3 files, on every control token but these.
_PHI3_NOT_RSTRIPPED = ("<unk>", "<s>", "<|endoftext|>")


def build_spm_tokenizer(metadata: Mapping[str, Any], source: str | Path) -> Tokenizer:
    """The SentencePiece-BPE tokenizer `metadata` describes (no post-processor: the caller adds BOS/EOS)."""
    token_strs: Sequence[str] = metadata["tokenizer.ggml.tokens"]
    token_types: Sequence[int] = metadata.get("tokenizer.ggml.token_type") or ()
    if len(token_types) != len(token_strs):
        raise ModelFormatError(source, "SentencePiece vocabulary without a kind for every token "
                                       "(tokenizer.ggml.token_type)")
    # SentencePiece-BPE scores fall with merge order; a file without them ranks by id
    scores: Sequence[float] = metadata.get("tokenizer.ggml.scores") or [-float(i) for i in range(len(token_strs))]
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(token_strs):
        vocab.setdefault(token, token_id)  # a piece listed twice keeps its first id
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk_token = token_strs[unk_id] if unk_id is not None else None
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=spm_merges(vocab, scores), unk_token=unk_token,
                              fuse_unk=True, byte_fallback=True, dropout=None))

    add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    replace_spaces = normalizers.Replace(" ", SPACE_PIECE)
    tokenizer.normalizer = (normalizers.Sequence([normalizers.Prepend(SPACE_PIECE), replace_spaces])
                            if add_space_prefix else replace_spaces)
    steps = [decoders.Replace(SPACE_PIECE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tokenizer.decoder = decoders.Sequence(steps)

    rstrip_control = metadata.get("general.architecture") == "phi3"
    special = [AddedToken(token, normalized=False, special=True,
                          rstrip=rstrip_control and kind == TOKEN_TYPE_CONTROL and token not in _PHI3_NOT_RSTRIPPED)
               for token, kind in zip(token_strs, token_types)
               if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN)]
    user_defined = [AddedToken(token, normalized=False, special=False)
                    for token, kind in zip(token_strs, token_types) if kind == TOKEN_TYPE_USER_DEFINED]
    if special:
        tokenizer.add_special_tokens(special)
    if user_defined:
        tokenizer.add_tokens(user_defined)
    return tokenizer


def spm_merges(vocab: Mapping[str, int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Every (left, right) split of a piece into two pieces, ranked by the merged piece's score
    (highest first: SentencePiece merges the best-scored pair), then by the parts' lengths
    (longest first), as transformers' `generate_merges` ranks them given the scores."""
    ranked = []
    for merged, merged_id in vocab.items():
        splits = [(merged[:cut], merged[cut:]) for cut in range(1, len(merged))
                  if merged[:cut] in vocab and merged[cut:] in vocab]
        splits.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        ranked.extend((scores[merged_id], len(left), len(right), left, right) for left, right in splits)
    ranked.sort(key=lambda entry: entry[:3], reverse=True)  # stable: equal keys keep the parts' id order
    return [(left, right) for _, _, _, left, right in ranked]

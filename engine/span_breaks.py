"""The token ids document span cuts prefer (cache/document_spans.py), read from the model's tokenizer."""

from pathlib import Path

from tokenizers import Tokenizer

from cache.document_spans import NO_BREAKS, SpanBreaks


def span_breaks(model_dir: Path) -> SpanBreaks:
    """Newline and blank-line tokens by their decoded text; special tokens as the tokenizer marks them.
    A model directory without a tokenizer (an engine fed token ids only) has none: span cuts then
    fall by the gear hash alone, which is still content-defined."""
    tokenizer_path = Path(model_dir) / "tokenizer.json"
    if not tokenizer_path.exists():
        return NO_BREAKS
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    texts = tokenizer.decode_batch([[token_id] for token_id in range(vocab_size)], skip_special_tokens=False)
    special_ids = frozenset(token_id for token_id, added in tokenizer.get_added_tokens_decoder().items()
                            if added.special)
    newline_ids = frozenset(i for i, text in enumerate(texts) if "\n" in text and i not in special_ids)
    paragraph_ids = frozenset(i for i in newline_ids if "\n\n" in texts[i])
    return SpanBreaks(newline_ids, paragraph_ids, special_ids)

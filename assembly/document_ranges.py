"""Where each document's text lies in a prompt's token ids: the exact spans of document KV reuse.

A document (from `documents` or `retrieval`) is rendered by a template or the built-in
documents block, inside markup that differs from prompt to prompt (its number, id, title).
Its KV is reusable at any position only for the tokens that are its text's own, so the
span is found by looking for those tokens: the text tokenized as the prompt builder
tokenizes request content (`as_text`, then `encode`), searched for in the prompt after
the previous document's span (documents render in order). A text's first or last token
may merge with the markup around it (leading or trailing whitespace joining a newline);
then the text's ids without that token are searched for, so a span never holds markup.
A document not found (a template that rewrites its text) has no span; span finding over
the token stream still covers it.

`document_token_ids` is the same search run on a prompt holding that one document: the ids
its text has inside any prompt, which ingest precomputes (they are the span's tokens).
`document_in_context` also gives what that prompt holds before them (the template's opening and
the documents block's markup): ingest computes the text after it, as a prompt would hold it.
"""

from collections.abc import Sequence

from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import SegmentTokenizer

_PROBE_MESSAGES = ({"role": "user", "content": "?"},)  # a question for the one-document prompt


def document_token_ranges(segments: SegmentTokenizer, prompt_ids: Sequence[int],
                          texts: Sequence[str], use_cache: bool = True) -> list[tuple[int, int]]:
    """Sorted, disjoint [start, end) token ranges of the texts found in `prompt_ids`, in order.
    Each text is tokenized through the segment cache (a popular document comes back request after
    request) unless `use_cache` is False."""
    ranges = []
    cursor = 0
    for text in texts:
        found = _locate(prompt_ids, text_token_ids(segments, text, use_cache), cursor)
        if found is not None:
            ranges.append(found)
            cursor = found[1]
    return ranges


def document_token_ids(builder: PromptBuilder, document: dict) -> list[int]:
    """The ids `document`'s text ({"text", "id"?, "title"?}) has inside a prompt: its span's tokens."""
    return document_in_context(builder, document)[1]


def document_in_context(builder: PromptBuilder, document: dict) -> tuple[list[int], list[int]]:
    """(context ids, text ids): a one-document prompt's ids before `document`'s text, and the text's
    own ids in it (document_token_ids). The context is the template's opening of the system turn
    and the documents block up to the text ([] when the text is not found in the prompt)."""
    # A one-off prompt: its segments (one new per chunk) would push hot ones out of the cache.
    prompt_ids = builder.build(_PROBE_MESSAGES, documents=[document], use_cache=False)
    found = document_token_ranges(builder.tokenizer, prompt_ids, [document["text"]], use_cache=False)
    if not found:
        return [], text_token_ids(builder.tokenizer, document["text"], use_cache=False)
    (start, end), = found
    return prompt_ids[:start], prompt_ids[start:end]


def text_token_ids(segments: SegmentTokenizer, text: str, use_cache: bool = True) -> list[int]:
    """A document's text tokenized alone, as the prompt builder tokenizes request content."""
    return segments.encode(segments.as_text(text), use_cache=use_cache)


def _locate(prompt_ids: Sequence[int], text_ids: list[int], cursor: int) -> tuple[int, int] | None:
    """The first range at or after `cursor` holding `text_ids`, or them less a merged edge token."""
    variants = [text_ids, text_ids[1:], text_ids[:-1], text_ids[1:-1]] if len(text_ids) > 2 else [text_ids]
    for ids in variants:
        start = _find(prompt_ids, ids, cursor)
        if start is not None:
            return start, start + len(ids)
    return None


def _find(haystack: Sequence[int], needle: list[int], start: int) -> int | None:
    """Index of the first occurrence of `needle` in `haystack` at or after `start`."""
    if not needle:
        return None
    haystack = haystack if isinstance(haystack, list) else list(haystack)
    first, length = needle[0], len(needle)
    position = start
    while True:
        try:
            position = haystack.index(first, position, len(haystack) - length + 1)
        except ValueError:
            return None
        if haystack[position : position + length] == needle:
            return position
        position += 1

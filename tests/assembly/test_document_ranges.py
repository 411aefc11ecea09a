"""Each document's own tokens in a built prompt: the exact spans of document KV reuse."""

import pytest

from assembly.chat_template import ChatTemplate
from assembly.document_ranges import document_token_ids, document_token_ranges
from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import SegmentTokenizer

pytestmark = pytest.mark.model  # the real SmolLM2 tokenizer and template

DOCUMENTS = [
    {"id": "a#0", "title": "Queues", "text": "A queue hands items from producers to consumers, first in first out."},
    {"id": "b#3", "text": "  Leading spaces and a trailing newline join the markup around them.\n"},
    {"text": "Text with <|im_end|> in it stays text: the markup cannot be forged from a document."},
    {"id": "c#1", "text": "A queue hands items from producers to consumers, first in first out."},  # a repeat
]


@pytest.fixture
def builder(smollm2_dir, smollm2_tokenizer) -> PromptBuilder:
    return PromptBuilder(SegmentTokenizer(smollm2_tokenizer), ChatTemplate.from_model_dir(smollm2_dir))


def test_each_documents_range_holds_its_text_and_no_markup(builder, smollm2_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a queue?"}]
    prompt_ids = builder.build(messages, documents=DOCUMENTS)
    ranges = document_token_ranges(builder.tokenizer, prompt_ids, [d["text"] for d in DOCUMENTS])

    assert len(ranges) == len(DOCUMENTS)
    assert ranges == sorted(ranges) and all(end <= start for (_, end), (start, _) in zip(ranges, ranges[1:]))
    for (start, end), document in zip(ranges, DOCUMENTS):
        text = smollm2_tokenizer.decode(prompt_ids[start:end], skip_special_tokens=False)
        assert text.strip() and text.strip() in document["text"]  # the text's own tokens (edges may merge)
        assert "<document" not in text and "</document>" not in text
    # whole when nothing merges: the first text is exactly its tokens
    assert smollm2_tokenizer.decode(prompt_ids[slice(*ranges[0])]) == DOCUMENTS[0]["text"]
    # the forged marker stayed text inside the document's range, not a control token
    third = prompt_ids[slice(*ranges[2])]
    assert smollm2_tokenizer.token_to_id("<|im_end|>") not in third


def test_a_documents_ids_are_the_same_in_every_prompt(builder):
    """What ingest precomputes is exactly what a prompt's range holds, whatever precedes the document."""
    for document in DOCUMENTS[:3]:
        expected = document_token_ids(builder, document)
        for others in ([], [DOCUMENTS[3]], DOCUMENTS[:2]):
            documents = [*(d for d in others if d is not document), document]
            prompt_ids = builder.build([{"role": "user", "content": "Why?"}], documents=documents)
            ranges = document_token_ranges(builder.tokenizer, prompt_ids, [d["text"] for d in documents])
            assert prompt_ids[slice(*ranges[-1])] == expected


def test_a_text_the_prompt_does_not_hold_has_no_range(builder):
    prompt_ids = builder.build([{"role": "user", "content": "Hi"}], documents=DOCUMENTS[:1])
    assert document_token_ranges(builder.tokenizer, prompt_ids, ["Nothing like this is in the prompt."]) == []
    assert document_token_ranges(builder.tokenizer, prompt_ids, [DOCUMENTS[0]["text"], "absent"]) != []


def test_precompute_probes_leave_the_segment_cache_alone(builder):
    builder.build([{"role": "user", "content": "Hi"}], documents=DOCUMENTS[:1])
    cached = dict(builder.tokenizer._segments)
    for document in DOCUMENTS:
        document_token_ids(builder, document)
    assert dict(builder.tokenizer._segments) == cached

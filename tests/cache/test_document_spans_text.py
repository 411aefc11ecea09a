"""find_spans on real prompts: the default model's tokenizer over real text (stdlib docstrings)."""

import pytest

from assembly.tokenizer import Tokenizer
from bench import corpus
from cache.document_spans import find_spans

pytestmark = pytest.mark.model  # the real SmolLM2 tokenizer

INSTRUCTIONS = "Answer from the documents below. Quote the document number you rely on, like [2]."


def rag_prompt(documents: list[str]) -> str:
    """Documents pasted into the system message, as most RAG clients send them (ChatML)."""
    context = "\n\n".join(f"Document [{number}]:\n{text}" for number, text in enumerate(documents, 1))
    return (f"<|im_start|>system\n{INSTRUCTIONS}\n\n{context}<|im_end|>\n"
            "<|im_start|>user\nWhat does the second document say?<|im_end|>\n<|im_start|>assistant\n")


def locate(prompt_ids: list[int], document_ids: list[int]) -> int:
    for start in range(len(prompt_ids) - len(document_ids) + 1):
        if prompt_ids[start : start + len(document_ids)] == document_ids:
            return start
    raise AssertionError("the document's own token ids are not in the prompt")


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir) -> Tokenizer:
    return Tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def documents() -> list[str]:
    return corpus.documents(5, 500)


def test_a_document_after_different_documents_gives_the_same_spans_inside_it(tokenizer, documents):
    shared_document = documents[2]
    document_ids = tokenizer.encode(shared_document)
    prompt_a = tokenizer.encode(rag_prompt([documents[0], shared_document, documents[4]]))
    prompt_b = tokenizer.encode(rag_prompt([documents[1], documents[3], shared_document]))
    start_a, start_b = locate(prompt_a, document_ids), locate(prompt_b, document_ids)
    assert start_a != start_b

    def inside(prompt_ids, start):
        return [(s - start, e - start) for s, e in find_spans(prompt_ids)
                if start <= s and e <= start + len(document_ids)]

    spans_a, spans_b = inside(prompt_a, start_a), inside(prompt_b, start_b)
    shared = sorted(set(spans_a) & set(spans_b))
    assert len(document_ids) > 500 and len(shared) >= 2
    between = [(s, e) for s, e in spans_a if shared[0][0] <= s and e <= shared[-1][1]]
    assert between == [(s, e) for s, e in spans_b if shared[0][0] <= s and e <= shared[-1][1]] == shared
    # most of the document is reusable from one prompt in the other: only its edge chunks differ
    assert sum(e - s for s, e in shared) > 0.5 * len(document_ids)


def test_a_document_as_an_exact_span_is_chunked_as_it_is_alone(tokenizer, documents):
    document_ids = tokenizer.encode(documents[3])
    prompt = tokenizer.encode(rag_prompt([*documents[:3], documents[3]]))
    start = locate(prompt, document_ids)
    spans = find_spans(prompt, [(start, start + len(document_ids))])
    inside = [(s - start, e - start) for s, e in spans if start <= s and e <= start + len(document_ids)]
    assert inside == find_spans(document_ids, [(0, len(document_ids))])
    assert sum(e - s for s, e in inside) > 0.8 * len(document_ids)

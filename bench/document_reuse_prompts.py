"""RAG prompts for the document-reuse quality bench: real passages, shuffled across prompts.

A pool of corpus passages (bench/corpus.py); every prompt draws `num_documents` distinct ones
uniformly and in random order, so one passage appears at different positions after different
passages, which is what document KV reuse must survive. Prompts take turns between three ways
of sending the documents: pasted into the system message, pasted into the user message (plain
OpenAI requests, as most RAG clients send them), and the `documents` field (exact spans).

Each question names a word that occurs in exactly one of the prompt's documents, so the answer
(that document's number) is known: "Which document mentions X?" is scored; the open questions
about the same word are not. Pure Python: no model, no tokenizer.
"""

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from bench import corpus

STYLES = ("system", "user", "documents")  # where the documents go; prompt i uses STYLES[i % 3]
PLAIN_STYLES = ("system", "user")
INSTRUCTIONS = ("You answer questions using only the numbered documents you are given. "
                "Keep the answer short.")
SCORED_QUESTION = "Which document mentions \"{word}\"? Answer with the document number only."
OPEN_QUESTIONS = ("What does the document that mentions \"{word}\" say about it?",
                  "Summarize what the documents say about \"{word}\" in one sentence.")
MIN_QUESTION_WORD_LETTERS = 6  # long words are distinctive: "which document mentions 'the'" is no question
_WORD = re.compile(r"[A-Za-z]+")


@dataclass(frozen=True)
class RagPrompt:
    index: int
    style: str  # one of STYLES
    document_ids: tuple[int, ...]  # pool indices, in prompt order
    messages: tuple[dict, ...]  # chat messages (documents pasted in, unless style == "documents")
    documents: tuple[dict, ...]  # the `documents` field ({"id", "text"}); empty for plain styles
    question_word: str
    answer_number: int  # 1-based number of the one document that contains question_word
    is_scored: bool  # the question asks for the number (accuracy counts it)


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def pasted_context(texts: Sequence[str]) -> str:
    return "\n\n".join(f"Document [{number}]:\n{text}" for number, text in enumerate(texts, start=1))


def rag_prompts(num_prompts: int, num_pool_documents: int, num_documents: int, document_words: int,
                seed: int) -> tuple[tuple[str, ...], list[RagPrompt]]:
    """(the pool's passages, the prompts). Deterministic for its arguments."""
    if num_documents < 2 or num_documents > num_pool_documents:
        raise ValueError(f"need 2 <= num_documents <= num_pool_documents, got {num_documents} of {num_pool_documents}")
    pool = corpus.documents(num_pool_documents, document_words)
    pool_words = [_words(text) for text in pool]
    rng = random.Random(f"{seed}-document-reuse")
    prompts: list[RagPrompt] = []
    while len(prompts) < num_prompts:
        document_ids = tuple(rng.sample(range(len(pool)), num_documents))  # distinct, random order
        answer_index = rng.randrange(num_documents)
        others = set().union(*(pool_words[d] for i, d in enumerate(document_ids) if i != answer_index))
        candidates = sorted(w for w in pool_words[document_ids[answer_index]] - others
                            if len(w) >= MIN_QUESTION_WORD_LETTERS)
        if not candidates:  # this draw has no word of its own in the answer document: draw again
            continue
        index = len(prompts)
        word = rng.choice(candidates)
        is_scored = index % 2 == 0
        question = (SCORED_QUESTION if is_scored else rng.choice(OPEN_QUESTIONS)).format(word=word)
        prompts.append(_prompt(index, STYLES[index % len(STYLES)], document_ids, [pool[d] for d in document_ids],
                               question, word, answer_index + 1, is_scored))
    return pool, prompts


def _prompt(index: int, style: str, document_ids: tuple[int, ...], texts: list[str], question: str,
            word: str, answer_number: int, is_scored: bool) -> RagPrompt:
    documents: tuple[dict, ...] = ()
    if style == "system":
        messages = ({"role": "system", "content": f"{INSTRUCTIONS}\n\n{pasted_context(texts)}"},
                    {"role": "user", "content": question})
    elif style == "user":
        messages = ({"role": "system", "content": INSTRUCTIONS},
                    {"role": "user", "content": f"{pasted_context(texts)}\n\nQuestion: {question}"})
    elif style == "documents":
        messages = ({"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": question})
        documents = tuple({"id": str(number), "text": text} for number, text in enumerate(texts, start=1))
    else:
        raise ValueError(f"unknown style {style!r}; choose from {', '.join(STYLES)}")
    return RagPrompt(index, style, document_ids, messages, documents, word, answer_number, is_scored)


def answer_is_correct(answer_text: str, prompt: RagPrompt) -> bool:
    """The first document number (1..num_documents) the answer names is the right one."""
    numbers = [int(n) for n in re.findall(r"\d+", answer_text) if 1 <= int(n) <= len(prompt.document_ids)]
    return bool(numbers) and numbers[0] == prompt.answer_number

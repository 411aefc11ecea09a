"""RAG requests: shared instructions + top-k documents + a short question.

Documents are corpus passages; request by request, k distinct ones are drawn with Zipf
popularity (weight of the document of rank r: 1 / r**s), as retrieval over real traffic
returns a few documents far more often than the rest. They are laid out in canonical
(rank) order, the layout that shares the longest prefixes: the most popular document
drawn comes first.
"""

import random

from bench import corpus
from bench.workload import ChatRequest, SingleRequest, Workload
from bench.workload_sizes import WorkloadSizes

RAG_INSTRUCTIONS = (
    "You answer questions about the Python standard library using only the documents below. "
    "Quote the document number you rely on, like [2]. If the documents do not contain the answer, "
    "say that you do not know instead of guessing. Keep the answer short."
)
QUESTIONS = (
    "What does the documentation say about {a}?",
    "How is {a} related to {b}?",
    "When should I use {a} rather than {b}?",
    "Which document explains {a}, and what does it say?",
)


def zipf_weights(num_items: int, exponent: float) -> list[float]:
    return [1.0 / rank**exponent for rank in range(1, num_items + 1)]


def draw_distinct(rng: random.Random, weights: list[float], k: int) -> list[int]:
    """k distinct indices, drawn one at a time with probability proportional to weight."""
    chosen: set[int] = set()
    while len(chosen) < k:
        chosen.add(rng.choices(range(len(weights)), weights)[0])
    return sorted(chosen)


def rag_workload(sizes: WorkloadSizes, seed: int) -> Workload:
    rng = random.Random(f"{seed}-rag")
    docs = corpus.documents(sizes.rag_num_corpus_documents, sizes.rag_document_words)
    weights = zipf_weights(len(docs), sizes.rag_zipf_exponent)
    vocabulary = corpus.words()
    sessions = []
    for _ in range(sizes.rag_num_requests):
        ranks = draw_distinct(rng, weights, sizes.rag_top_k)
        context = "\n\n".join(f"Document [{rank + 1}]:\n{docs[rank]}" for rank in ranks)
        question = rng.choice(QUESTIONS).format(a=rng.choice(vocabulary), b=rng.choice(vocabulary))
        messages = ({"role": "system", "content": f"{RAG_INSTRUCTIONS}\n\n{context}"},
                    {"role": "user", "content": question})
        sessions.append(SingleRequest(ChatRequest(messages, sizes.max_tokens)))
    return Workload("rag", f"{sizes.rag_num_requests} requests, top-{sizes.rag_top_k} of "
                    f"{len(docs)} docs (~{sizes.rag_document_words} words, Zipf s={sizes.rag_zipf_exponent})",
                    sessions)

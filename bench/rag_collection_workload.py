"""RAG over a collection ingested beforehand: the `rag` workload's questions, documents by `retrieval`.

The collection holds corpus passages of the `rag` workload's size and number, but the passages
after the ones `rag` uses, so a server that ran `rag` first holds none of them in any cache: what
the collection's requests find cached is what ingest precomputed. Each request asks one of the
`rag` questions (same seed, same questions) and retrieves top-k with a query made of words of a
passage drawn with Zipf popularity, so, as in real traffic, a few passages come back again and
again. radixserve only (`retrieval` is its extension); talks HTTP only.
"""

import random
import time

import httpx

from bench import corpus
from bench.rag_workload import QUESTIONS, RAG_INSTRUCTIONS, draw_distinct, zipf_weights
from bench.workload import ChatRequest, SingleRequest, Workload
from bench.workload_sizes import WorkloadSizes

COLLECTION = "bench-rag-collection"
NUM_QUERY_WORDS = 12
ADD_BATCH = 32  # documents per POST


def collection_passages(sizes: WorkloadSizes) -> tuple[str, ...]:
    """The passages after the `rag` workload's own (same size, same count)."""
    num = sizes.rag_num_corpus_documents
    return corpus.documents(2 * num, sizes.rag_document_words)[num:]


def rag_collection_workload(sizes: WorkloadSizes, seed: int) -> Workload:
    passages = collection_passages(sizes)
    rng = random.Random(f"{seed}-rag")  # the `rag` workload's draws: the same questions
    query_rng = random.Random(f"{seed}-rag-collection")
    weights = zipf_weights(len(passages), sizes.rag_zipf_exponent)
    vocabulary = corpus.words()
    sessions = []
    for _ in range(sizes.rag_num_requests):
        draw_distinct(rng, weights, sizes.rag_top_k)  # keeps the question draws in step with `rag`
        question = rng.choice(QUESTIONS).format(a=rng.choice(vocabulary), b=rng.choice(vocabulary))
        words = passages[query_rng.choices(range(len(passages)), weights)[0]].split()
        start = query_rng.randrange(max(1, len(words) - NUM_QUERY_WORDS))
        query = " ".join(words[start:start + NUM_QUERY_WORDS])
        messages = ({"role": "system", "content": RAG_INSTRUCTIONS}, {"role": "user", "content": question})
        retrieval = {"retrieval": {"collection": COLLECTION, "top_k": sizes.rag_top_k, "query": query}}
        sessions.append(SingleRequest(ChatRequest(messages, sizes.max_tokens, extra_body=retrieval)))
    return Workload("rag_collection", f"{sizes.rag_num_requests} requests, `retrieval` top-{sizes.rag_top_k} "
                    f"of a collection of {len(passages)} docs (~{sizes.rag_document_words} words) ingested "
                    f"beforehand, queries from Zipf-drawn docs (s={sizes.rag_zipf_exponent})", sessions)


def fill_collection(base_url: str, passages: tuple[str, ...], api_key: str | None = None,
                    timeout_s: float = 3600.0) -> tuple[float, int]:
    """Create the collection and add the passages (the server precomputes their KV if it does);
    returns (seconds taken, prompt tokens of KV precomputed as the server reports them)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.perf_counter()
    num_precomputed = 0
    with httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s) as client:
        response = client.post("/v1/collections", json={"name": COLLECTION})
        if response.status_code != 201:
            raise RuntimeError(f"creating the collection: HTTP {response.status_code}: {response.text[:200]}")
        for first in range(0, len(passages), ADD_BATCH):
            batch = [{"id": f"doc-{i + 1}", "text": text}
                     for i, text in enumerate(passages[first:first + ADD_BATCH], start=first)]
            response = client.post(f"/v1/collections/{COLLECTION}/documents", json={"documents": batch})
            if response.status_code != 200:
                raise RuntimeError(f"adding documents: HTTP {response.status_code}: {response.text[:200]}")
            num_precomputed += int(response.json().get("num_precomputed_tokens") or 0)
    return time.perf_counter() - started, num_precomputed

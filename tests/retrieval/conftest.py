"""Retrieval fixtures: the real embedding model (pulled once) and a fast fake embedder for
collection tests that are about storage and indexing, not about embedding quality."""

import zlib
from pathlib import Path

import numpy as np
import pytest

from store import model_store
from retrieval.chunking import TokenSpans
from retrieval.embedder import EmbeddingBatch

EMBEDDING_MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return model_store.pull(EMBEDDING_MODEL, progress=False)


@pytest.fixture(scope="session")
def embedder(minilm_dir):
    from retrieval.embedder import Embedder

    return Embedder(minilm_dir)


class FakeEmbedder:
    """Each whitespace-separated word is one token; a text's vector is its hashed bag of words,
    normalised: texts that share words are similar, identical texts score 1."""

    name = "fake-bag-of-words"

    def __init__(self, dim: int = 64, max_chunk_tokens: int = 16):
        self.dim = dim
        self.max_chunk_tokens = max_chunk_tokens
        self.num_embedded = 0

    def token_spans(self, text: str) -> TokenSpans:
        offsets, start = [], None
        for i, ch in enumerate(text + " "):
            if ch.isspace() and start is not None:
                offsets.append((start, i))
                start = None
            elif not ch.isspace() and start is None:
                start = i
        return TokenSpans(offsets, list(range(len(offsets))))

    def embed(self, texts) -> EmbeddingBatch:
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                vectors[row, zlib.crc32(word.encode()) % self.dim] += 1
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
        self.num_embedded += len(texts)
        return EmbeddingBatch(vectors, [len(t.split()) + 2 for t in texts])


@pytest.fixture
def fake_embedder() -> FakeEmbedder:
    return FakeEmbedder()

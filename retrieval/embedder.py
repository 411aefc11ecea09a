"""Sentence embeddings with all-MiniLM-L6-v2 (or any BERT sentence-transformers directory).

    embedder = Embedder(model_dir)              # config.json, model.safetensors, tokenizer.json
    batch = embedder.embed(["a text", ...])     # batch.vectors: (N, 384) float32, each of L2 norm 1
    spans = embedder.token_spans(long_text)     # word-piece offsets, untruncated: what chunking cuts at
    batch = embedder.embed(texts, truncate=False)   # InvalidInputError for a text over the window
    batch = embedder.embed_token_ids([[7592, 2088], ...])  # word-piece ids, without [CLS] / [SEP]

A text is tokenized to at most `max_tokens` word-pieces ([CLS] and [SEP] included; longer
texts are truncated, as sentence-transformers does, unless truncate=False: then refused),
run through the encoder, mean-pooled
over its attention mask and L2-normalised. Texts are embedded in batches of `batch_size`,
sorted by length so that little padding is computed; results come back in input order.
Thread-safe: one batch runs at a time.
"""

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from tokenizers import Tokenizer

from retrieval.bert import BertEncoder
from retrieval.chunking import TokenSpans
from retrieval.errors import InvalidInputError

DEFAULT_MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length (sentence_bert_config.json)
DEFAULT_BATCH_SIZE = 32


class EmbeddingBatch(NamedTuple):
    vectors: np.ndarray  # (N, dim) float32, rows L2-normalised
    num_tokens: list[int]  # per text, after truncation, special tokens included


class Embedder:
    def __init__(self, model_dir: str | Path, *, max_tokens: int = DEFAULT_MAX_TOKENS,
                 batch_size: int = DEFAULT_BATCH_SIZE, device: str = "cpu"):
        model_dir = Path(model_dir)
        self.model = BertEncoder.from_model_dir(model_dir, device=device)
        self.device = torch.device(device)
        limit = self.model.config.max_position_embeddings
        if not 2 < max_tokens <= limit:
            raise ValueError(f"max tokens must be in [3, {limit}], got {max_tokens}")
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.name = model_dir.name
        self.dim = self.model.config.hidden_size
        # tokenizer.json ships with fixed padding/truncation at 128: set both explicitly.
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tokenizer.enable_truncation(max_length=max_tokens)
        self._tokenizer.enable_padding(pad_id=self._tokenizer.token_to_id("[PAD]") or 0, pad_token="[PAD]")
        self._spans_tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._spans_tokenizer.no_truncation()
        self._spans_tokenizer.no_padding()
        # A text's "[SEP]" or "[CLS]" is text, not the marker the encoder reads as a boundary.
        self._tokenizer.encode_special_tokens = True
        self._spans_tokenizer.encode_special_tokens = True
        self._lock = threading.Lock()
        # Runs the encoder's forward (work -> its result): inline by default; a server hands it the engine
        # thread's runner, so that one thread of the process starts OpenMP's parallel work (AsyncEngine.run_compute).
        self.compute: Callable[[Callable[[], np.ndarray]], np.ndarray] = _inline

    @property
    def max_chunk_tokens(self) -> int:
        """The most word-pieces of a text that fit without truncation ([CLS] and [SEP] take two)."""
        return self.max_tokens - 2

    def token_spans(self, text: str) -> TokenSpans:
        """The text's word-pieces without special tokens or truncation (what chunking cuts at)."""
        encoding = self._spans_tokenizer.encode(text, add_special_tokens=False)
        return TokenSpans(list(encoding.offsets), [-1 if w is None else w for w in encoding.word_ids])

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def embed(self, texts: Sequence[str], *, truncate: bool = True) -> EmbeddingBatch:
        """truncate=False: a text longer than the window raises InvalidInputError (param "input")."""
        num_texts = len(texts)
        vectors = np.empty((num_texts, self.dim), dtype=np.float32)
        num_tokens = [0] * num_texts
        if num_texts == 0:
            return EmbeddingBatch(vectors, num_tokens)
        with self._lock:
            lengths = [len(e.ids) for e in self._spans_tokenizer.encode_batch(list(texts), add_special_tokens=False)]
            if not truncate:
                self._check_lengths(lengths)
            order = sorted(range(num_texts), key=lambda i: lengths[i])
            for start in range(0, num_texts, self.batch_size):
                indices = order[start:start + self.batch_size]
                batch_vectors, batch_tokens = self._embed_batch([texts[i] for i in indices])
                vectors[indices] = batch_vectors
                for i, n in zip(indices, batch_tokens):
                    num_tokens[i] = n
        return EmbeddingBatch(vectors, num_tokens)

    def embed_token_ids(self, token_id_lists: Sequence[Sequence[int]]) -> EmbeddingBatch:
        """Inputs already tokenized: word-piece ids without [CLS] / [SEP], which are added. An input
        over the window or an id outside the vocabulary raises InvalidInputError (param "input")."""
        num_inputs = len(token_id_lists)
        vectors = np.empty((num_inputs, self.dim), dtype=np.float32)
        self._check_lengths([len(ids) for ids in token_id_lists])
        for i, ids in enumerate(token_id_lists):
            bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise InvalidInputError(f"input[{i}] holds token id {bad}, outside the embedding model's "
                                        f"vocabulary [0, {self.vocab_size})", "input")
        cls_id, sep_id = self._tokenizer.token_to_id("[CLS]"), self._tokenizer.token_to_id("[SEP]")
        pad_id = self._tokenizer.token_to_id("[PAD]") or 0
        with self._lock:
            order = sorted(range(num_inputs), key=lambda i: len(token_id_lists[i]))
            for start in range(0, num_inputs, self.batch_size):
                indices = order[start:start + self.batch_size]
                rows = [[cls_id, *token_id_lists[i], sep_id] for i in indices]
                width = max(len(row) for row in rows)
                input_ids = torch.tensor([row + [pad_id] * (width - len(row)) for row in rows], device=self.device)
                mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows], device=self.device)
                vectors[indices] = self._pooled(input_ids, mask)
        return EmbeddingBatch(vectors, [len(ids) + 2 for ids in token_id_lists])

    def _check_lengths(self, lengths: Sequence[int]) -> None:
        """lengths: word-pieces per input, special tokens not counted."""
        for i, length in enumerate(lengths):
            if length > self.max_chunk_tokens:
                raise InvalidInputError(
                    f"input[{i}] has {length + 2} tokens ([CLS] and [SEP] included); the embedding model "
                    f"takes at most {self.max_tokens}: split it, or embed a shorter text", "input")

    def _embed_batch(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        encodings = self._tokenizer.encode_batch(texts)
        input_ids = torch.tensor([e.ids for e in encodings], device=self.device)  # (B, T)
        mask = torch.tensor([e.attention_mask for e in encodings], device=self.device)  # (B, T)
        return self._pooled(input_ids, mask), mask.sum(dim=1).tolist()

    def _pooled(self, input_ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
        """(B, T) ids and mask -> (B, dim) float32 unit vectors."""
        def forward() -> np.ndarray:
            with torch.inference_mode():
                hidden = self.model(input_ids, mask)  # (B, T, H)
                pooled = mean_pool(hidden, mask)
            return pooled.float().cpu().numpy()

        return self.compute(forward)


def _inline(work: Callable[[], np.ndarray]) -> np.ndarray:
    return work()


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, H) hidden states, (B, T) mask -> (B, H) mean over unmasked tokens, L2-normalised."""
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    summed = (hidden * weights).sum(dim=1)
    mean = summed / weights.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1)

"""The torch BERT encoder + pooling against transformers' BertModel with the same pooling."""

import numpy as np
import pytest
import torch

from retrieval.embedder import Embedder, mean_pool

pytestmark = pytest.mark.model

TEXTS = [
    "Paris is the capital of France.",
    "x",
    "The quick brown fox jumps over the lazy dog. " * 80,  # ~800 word-pieces: truncated to 256
    "Über naïve café façades — déjà vu!  Tabs\tand\nnewlines.",
    "A medium sentence about retrieval augmented generation with FAISS indexes and SQLite stores.",
]


def _reference(model_dir, texts: list[str]) -> np.ndarray:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.BertModel.from_pretrained(model_dir, add_pooling_layer=False).eval()
    inputs = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state
    return mean_pool(hidden, inputs["attention_mask"]).numpy()


def test_embeddings_match_transformers_bert_model(minilm_dir):
    embedder = Embedder(minilm_dir, batch_size=2)  # several batches, sorted by length, put back in order
    batch = embedder.embed(TEXTS)
    assert batch.vectors.shape == (len(TEXTS), 384) and batch.vectors.dtype == np.float32
    np.testing.assert_allclose(batch.vectors, _reference(minilm_dir, TEXTS), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(batch.vectors, axis=1), 1.0, atol=1e-6)
    assert batch.num_tokens[1] == 3 and batch.num_tokens[2] == 256  # [CLS] x [SEP]; truncated


def test_batching_does_not_change_a_text_s_vector(embedder):
    alone = np.stack([embedder.embed([t]).vectors[0] for t in TEXTS])
    np.testing.assert_allclose(embedder.embed(TEXTS).vectors, alone, atol=1e-5)
    assert embedder.embed([]).vectors.shape == (0, 384)


def test_similar_texts_score_higher(embedder):
    v = embedder.embed(["The cat sat on the mat.", "A cat was sitting on a rug.", "Quarterly tax filing rules."])
    assert v.vectors[0] @ v.vectors[1] > v.vectors[0] @ v.vectors[2] + 0.3


def test_token_spans_are_untruncated_word_pieces(embedder):
    text = "unbelievably long " * 300
    spans = embedder.token_spans(text)
    assert len(spans.offsets) > 256 and len(spans.offsets) == len(spans.word_ids)
    start, end = spans.offsets[0]
    assert text[start:end] == "un"  # 'unbelievably' is several pieces of one word
    assert spans.word_ids[0] == spans.word_ids[1]


def test_marker_strings_in_a_text_are_text_not_the_encoder_s_markers(embedder):
    """[CLS]/[SEP]/[PAD]/[MASK] written in a document are word-pieces; only the embedder adds markers."""
    text = "first part [SEP] [CLS] second [MASK] part [PAD]"
    ids = embedder._tokenizer.encode(text).ids
    markers = {embedder._tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]")}
    assert [i for i in ids if i in markers] == [ids[0], ids[-1]] and len(ids) > 12
    assert len(embedder.token_spans(text).offsets) == len(ids) - 2


def test_the_forward_runs_through_the_compute_runner_with_equal_vectors(embedder):
    # A server hands the engine thread's runner (AsyncEngine.run_compute); the vectors do not change.
    import threading

    import numpy as np

    texts = ["the lighthouse keeper", "a short one"]
    inline = embedder.embed(texts).vectors
    ran_on = []

    def on_another_thread(work):
        result = {}

        def run():
            ran_on.append(threading.current_thread().name)
            result["value"] = work()

        thread = threading.Thread(target=run, name="compute-thread")
        thread.start()
        thread.join()
        return result["value"]

    inline_runner, embedder.compute = embedder.compute, on_another_thread
    try:
        routed = embedder.embed(texts).vectors
    finally:
        embedder.compute = inline_runner  # the session's embedder is shared
    assert ran_on and set(ran_on) == {"compute-thread"}
    np.testing.assert_allclose(routed, inline, rtol=1e-5, atol=1e-6)

"""Where a request's prompt KV came from, per request (RequestOutput's counts), equals what the engine
counted for it: the disk tier's loads, the document store's placed and recomputed tokens, speculation's
drafts. The console draws these (server/request_records.py)."""

import os
import random

from engine.document_reuse_config import DocumentReuseConfig
from engine.engine_config import EngineConfig
from engine.kv_disk_config import KVDiskConfig
from engine.speculation_config import SpeculationConfig
from engine.llm_engine import LLMEngine
from engine.request_options import RequestOptions
from engine.sampling_params import SamplingParams

TEST_DEVICE = os.environ.get("RADIXSERVE_TEST_DEVICE", "cpu")
PAGE_SIZE = 16
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def _tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(length)]


def _engine(model_dir, **overrides) -> LLMEngine:
    settings = dict(model_dir=model_dir, device=TEST_DEVICE, dtype="float32", page_size=PAGE_SIZE,
                    kv_cache_bytes=16 << 20, max_num_batched_tokens=2048)
    settings.update(overrides)
    return LLMEngine(EngineConfig(**settings))


def _last_output(engine: LLMEngine, prompt: list[int], options: RequestOptions | None = None,
                 params: SamplingParams = GREEDY):
    request = engine.add_request(f"r{random.random()}", prompt, params, None,
                                 **({"options": options} if options else {}))
    last = None
    while not request.is_finished:
        for output in engine.step():
            last = output
    return last


def test_disk_tier_tokens_are_what_the_tier_loaded_for_the_request(tiny_llama_dir, tmp_path):
    prompt = _tokens(0, 150)
    first = _engine(tiny_llama_dir, kv_disk=KVDiskConfig(directory=tmp_path))
    cold = _last_output(first, prompt)
    assert cold.num_cached_tokens == cold.num_disk_tier_tokens == 0
    first.close()

    restarted = _engine(tiny_llama_dir, kv_disk=KVDiskConfig(directory=tmp_path))
    warm = _last_output(restarted, prompt)
    assert warm.num_disk_tier_tokens == restarted.stats().kv_disk.num_hit_tokens == 144  # 9 full pages
    assert warm.num_cached_tokens == warm.num_disk_tier_tokens  # the whole hit came from the tier
    again = _last_output(restarted, prompt)
    assert again.num_cached_tokens == 144 and again.num_disk_tier_tokens == 0  # now in the tree
    restarted.close()


def test_document_counts_are_the_plans(tiny_llama_dir):
    engine = _engine(tiny_llama_dir, documents=DocumentReuseConfig(enabled=True, min_span_tokens=16, boundary_tokens=4))
    system, other_system, question = _tokens(1, 12), _tokens(2, 15), _tokens(3, 10)
    doc_a, doc_b = _tokens(10, 50), _tokens(11, 50)

    def prompt(head):
        spans = ((len(head), len(head) + 50), (len(head) + 50, len(head) + 100))
        return head + doc_a + doc_b + question, RequestOptions(document_reuse=True, document_spans=spans)

    _last_output(engine, *prompt(system))  # stores both spans
    before = engine.stats()
    moved = _last_output(engine, *prompt(other_system))
    after = engine.stats()
    assert moved.num_reused_document_tokens == after.documents.num_reused_tokens - before.documents.num_reused_tokens > 0
    assert moved.num_recomputed_document_tokens == (after.documents.num_recomputed_tokens
                                                    - before.documents.num_recomputed_tokens) > 0
    assert moved.num_cached_tokens >= moved.num_reused_document_tokens
    assert moved.num_disk_tier_tokens == 0


def test_speculation_counts_are_the_requests_share_of_the_engines(tiny_llama_dir):
    engine = _engine(tiny_llama_dir, speculation=SpeculationConfig("ngram", max_verify_rows_per_step=2048))
    segment = _tokens(4, 12)
    last = _last_output(engine, segment * 4, params=SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    stats = engine.stats()
    assert (last.num_draft_tokens, last.num_accepted_draft_tokens) == (stats.speculation.num_draft_tokens,
                                                                       stats.speculation.num_accepted_tokens)
    assert last.num_accepted_draft_tokens <= last.num_draft_tokens

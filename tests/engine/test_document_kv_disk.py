"""The document store on disk with the tiny model: a restarted engine reuses precomputed documents
without computing them, exactly as an in-memory hit would; memory eviction keeps the disk copy; salts
stay apart; a damaged file is a miss; derived (stitched) pages never reach the page tier."""

import os
import random
from dataclasses import replace

from cache.document_disk import document_key_hash
from cache.page_file import SPAN_FILE, page_file_name
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.request_options import RequestOptions
from engine.sampling_params import SamplingParams
from engine.kv_disk_config import KVDiskConfig
from tests.engine.test_document_reuse import REUSE, _assert_drained

TEST_DEVICE = os.environ.get("RADIXSERVE_TEST_DEVICE", "cpu")
DOC_LEN, SYSTEM_LEN, QUESTION_LEN = 50, 12, 10
OFF = RequestOptions(document_reuse=False)
# tiny_llama: 2 layers, 2 KV heads of 16 dims, float32: 256 bytes of KV a token
DOC_KV_BYTES = DOC_LEN * 2 * 2 * 2 * 16 * 4


def _tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 256) for _ in range(length)]


DOCS = {name: _tokens(100 + i, DOC_LEN) for i, name in enumerate("ABCD")}
SYSTEM, QUESTION = _tokens(1, SYSTEM_LEN), _tokens(3, QUESTION_LEN)


def _prompt(names: str) -> tuple[list[int], RequestOptions]:
    tokens, spans = list(SYSTEM), []
    for name in names:
        spans.append((len(tokens), len(tokens) + DOC_LEN))
        tokens += DOCS[name]
    return tokens + QUESTION, RequestOptions(document_reuse=True, document_spans=tuple(spans))


def _engine(model_dir, kv_disk_dir, **overrides) -> LLMEngine:
    settings = dict(model_dir=model_dir, device=TEST_DEVICE, dtype="float32", page_size=16, kv_cache_bytes=16 << 20,
                    max_num_batched_tokens=2048, max_num_seqs=16, documents=REUSE,
                    kv_disk=KVDiskConfig(directory=kv_disk_dir))
    settings.update(overrides)
    return LLMEngine(EngineConfig(**settings))


def _run(engine: LLMEngine, prompt, options, salt=None):
    """(greedy output ids, cached tokens, reused document tokens, prompt tokens computed)."""
    num_prefill_before = engine.metrics.num_prefill_tokens
    request = engine.add_request(f"r{engine.num_steps}-{random.random()}", prompt,
                                 SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), salt, options)
    while not request.is_finished:
        engine.step()
    return (list(request.output_token_ids), request.num_cached_tokens, request.num_reused_document_tokens,
            engine.metrics.num_prefill_tokens - num_prefill_before)


def _precompute_and_close(model_dir, kv_disk_dir, names="AB", salt=None, **overrides) -> None:
    engine = _engine(model_dir, kv_disk_dir, **overrides)
    assert engine.precompute_documents([DOCS[name] for name in names], cache_salt=salt) == len(names) * DOC_LEN
    engine.close()


def test_a_restarted_engine_reuses_precomputed_documents_exactly_as_an_in_memory_hit(tiny_llama_dir, tmp_path):
    _precompute_and_close(tiny_llama_dir, tmp_path)
    restarted = _engine(tiny_llama_dir, tmp_path)
    stats = restarted.stats()
    assert (stats.documents.num_disk_entries, stats.documents.num_store_entries) == (2, 0)
    assert stats.documents.num_disk_bytes > 2 * DOC_KV_BYTES
    assert restarted.precompute_documents([DOCS["A"], DOCS["B"]]) == 0  # on disk: nothing to compute

    in_memory = _engine(tiny_llama_dir, None)  # the reference: the same documents precomputed in this process
    in_memory.precompute_documents([DOCS["A"], DOCS["B"]])
    for names in ("BA", "AB"):
        prompt, options = _prompt(names)
        got, want = _run(restarted, prompt, options), _run(in_memory, prompt, options)
        assert got == want  # outputs, cached, reused and computed tokens
        if names == "BA":  # both spans placed but their first k = 4 tokens; the rest computed
            assert got[2] == 2 * DOC_LEN - 8 and got[3] == len(prompt) - got[2]
    stats = restarted.stats()
    assert (stats.documents.num_disk_hits, stats.documents.num_store_entries) == (2, 2)  # loaded once each
    _assert_drained(restarted)
    restarted.close()


def test_documents_precomputed_in_context_keep_their_leads_across_a_restart(tiny_llama_dir, tmp_path):
    """A span precomputed after a context keeps that context's last tokens (its leads) with its KV:
    after a restart they load with it, so a prompt holding the same tokens before the span places
    them too, exactly as the engine that precomputed it does."""
    contexts = [SYSTEM + _tokens(7, 6), SYSTEM + _tokens(8, 6)]  # e.g. the documents block's markup
    first = _engine(tiny_llama_dir, tmp_path)
    first.precompute_documents([DOCS["A"], DOCS["B"]], context_token_id_lists=contexts)
    leads = {entry.key[0][:1]: entry.lead_ids for entry in first.document_store.entries()}
    assert all(leads.values())
    first.close()
    restarted = _engine(tiny_llama_dir, tmp_path)
    in_memory = _engine(tiny_llama_dir, None)
    in_memory.precompute_documents([DOCS["A"], DOCS["B"]], context_token_id_lists=contexts)
    prompt = contexts[1] + DOCS["B"] + _tokens(7, 6) + DOCS["A"] + QUESTION
    b_start = len(contexts[1])
    a_start = b_start + DOC_LEN + 6
    options = RequestOptions(document_reuse=True, document_spans=((b_start, b_start + DOC_LEN), (a_start, a_start + DOC_LEN)))
    got, want = _run(restarted, prompt, options), _run(in_memory, prompt, options)
    assert got == want
    # B right after its own context is an exact prefix (the page tier); A is loaded with its leads
    loaded = {entry.key[0][:1]: entry.lead_ids for entry in restarted.document_store.entries()}
    assert loaded[tuple(DOCS["A"][:1])] == leads[tuple(DOCS["A"][:1])]
    _assert_drained(restarted)
    restarted.close()


def test_memory_eviction_keeps_the_disk_copy_and_a_memory_miss_loads_it(tiny_llama_dir, tmp_path):
    engine = _engine(tiny_llama_dir, tmp_path, documents=replace(REUSE, store_bytes=2 * DOC_KV_BYTES))
    reference = _engine(tiny_llama_dir, None)
    engine.precompute_documents([DOCS[name] for name in "ABC"])
    reference.precompute_documents([DOCS[name] for name in "AC"])
    stats = engine.stats()
    assert (stats.documents.num_store_entries, stats.documents.num_disk_entries) == (2, 3)  # A left memory only
    prompt, options = _prompt("AC")  # loading A evicts B from memory, the least recently used
    got = _run(engine, prompt, options)
    assert got == _run(reference, prompt, options) and got[2] == 2 * DOC_LEN - 8
    assert engine.stats().documents.num_disk_hits == 1  # A, from disk
    _assert_drained(engine)
    engine.close()


def test_a_tenant_never_reads_another_tenants_documents_from_disk(tiny_llama_dir, tmp_path):
    _precompute_and_close(tiny_llama_dir, tmp_path, salt="tenant-a")
    restarted = _engine(tiny_llama_dir, tmp_path)
    prompt, options = _prompt("AB")
    for salt in ("tenant-b", None):
        assert _run(restarted, prompt, options, salt)[2] == 0
    restarted.scheduler.tree.evict(restarted.scheduler.allocator.num_pages)
    assert _run(restarted, prompt, options, "tenant-a")[2] > 0
    _assert_drained(restarted)
    restarted.close()


def test_a_damaged_document_file_is_a_miss_and_the_span_is_computed_again(tiny_llama_dir, tmp_path):
    _precompute_and_close(tiny_llama_dir, tmp_path, names="A")
    engine = _engine(tiny_llama_dir, tmp_path)
    path = engine.document_disk.disk.directory / page_file_name(document_key_hash((tuple(DOCS["A"]), None)), SPAN_FILE)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(data)
    prompt, options = _prompt("A")
    got = _run(engine, prompt, options)
    assert got == _run(_engine(tiny_llama_dir, None), prompt, options)  # as with an empty store
    assert got[2] == 0 and engine.stats().documents.num_disk_misses == 1
    engine.document_disk.disk.flush()
    assert engine.stats().documents.num_disk_entries == 1 and path.exists()  # stored again from this prompt
    engine.close()


def test_another_kv_layout_never_reads_the_documents(tiny_llama_dir, tmp_path):
    _precompute_and_close(tiny_llama_dir, tmp_path, names="A")
    other = _engine(tiny_llama_dir, tmp_path, page_size=32)  # another fingerprint: another directory
    assert other.stats().documents.num_disk_entries == 0
    assert other.precompute_documents([DOCS["A"]]) == DOC_LEN
    other.close()


def test_derived_pages_never_reach_the_page_tier_and_exact_lookups_after_a_restart_stay_exact(tiny_llama_dir,
                                                                                                tmp_path):
    first = _engine(tiny_llama_dir, tmp_path)
    first.precompute_documents([DOCS["A"], DOCS["B"]])
    prompt, options = _prompt("BA")
    _, _, num_reused, _ = _run(first, prompt, options)  # stitched: derived pages from position 16 on
    assert num_reused > 0
    tree = first.scheduler.tree
    assert tree.match_prefix(prompt, None).page_ids.__len__() == 1  # the exact page before the first placed one
    first.kv_tier.tier.flush()
    num_pages_written = first.stats().kv_disk.num_pages
    # the exact pages: the two precompute prompts' full pages (3 each) and the prompt's first page
    assert num_pages_written == 2 * (DOC_LEN // 16) + 1
    first.close()

    restarted = _engine(tiny_llama_dir, tmp_path)
    reference = _engine(tiny_llama_dir, None, documents=replace(REUSE, enabled=False))
    got = _run(restarted, prompt, OFF)
    assert got[0] == _run(reference, prompt, OFF)[0]
    assert got[1] == 16 and got[2] == 0  # only the exact page came from the tier
    _assert_drained(restarted)
    restarted.close()


def test_a_prompt_with_more_stored_documents_than_memory_holds_places_what_fits(tiny_llama_dir, tmp_path):
    """Loads from disk during planning never evict an entry the plan already took: with memory for two
    spans, the first two of four are placed, the rest computed (and left as they are on disk)."""
    engine = _engine(tiny_llama_dir, tmp_path, documents=replace(REUSE, store_bytes=2 * DOC_KV_BYTES))
    engine.precompute_documents([DOCS[name] for name in "ABCD"])
    engine.scheduler.tree.evict(engine.scheduler.allocator.num_pages)
    prompt, options = _prompt("DCBA")  # D and C are in memory; B and A on disk only
    reference = _engine(tiny_llama_dir, None, documents=replace(REUSE, store_bytes=2 * DOC_KV_BYTES))
    reference.precompute_documents([DOCS[name] for name in "DC"])
    got = _run(engine, prompt, options)
    assert got == _run(reference, prompt, options) and got[2] == 2 * (DOC_LEN - 4)
    assert engine.stats().documents.num_disk_entries == 4
    _assert_drained(engine)
    prompt, options = _prompt("BADC")  # now B and A come from disk, evicting D and C
    assert _run(engine, prompt, options)[2] == 2 * (DOC_LEN - 4)
    assert engine.stats().documents.num_disk_hits == 2
    _assert_drained(engine)
    engine.close()

"""Every supported family through the engine against transformers on the same tiny random weights,
once per backend (torch, cpu, cpu without a C compiler): logits of a cold prefill in chunks, of a
prompt whose prefix is cached, and of requests batched together (prefill chunks beside decodes,
the decodes' logprobs against a forward pass over the generated tokens)."""

import random
from dataclasses import replace

import pytest
import torch

from engine.document_reuse_config import DocumentReuseConfig
from engine.engine_config import EngineConfig
from engine.speculation_config import SpeculationConfig
from engine.llm_engine import LLMEngine
from engine.prompt_tail_logits import collect_tail_logits
from engine.sampling_params import SamplingParams
from tests.model.tiny_families import FAMILIES, PHI3_ORIGINAL_CONTEXT, TINY, WINDOW, WINDOWED, make_tiny, \
    reference_logits

ATOL = 1e-4
VOCAB = TINY["vocab_size"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and on a loaded machine their OpenMP waits cost seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, make_tiny(request.param, path)


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _engine(model_dir, backend: str, **overrides) -> LLMEngine:
    settings = dict(model_dir=model_dir, device="cpu", dtype="float32", page_size=4, kv_cache_bytes=4 << 20,
                    max_num_batched_tokens=16, max_num_seqs=8, backend=backend)
    return LLMEngine(EngineConfig(**{**settings, **overrides}))


def _run_together(engine: LLMEngine, tails: list[tuple[list[int], int]], decode: tuple[list[int], int]):
    """Admit the tail-logit requests and one generating request at once; step until all finish.
    -> (each tail request's logits, the generated ids, their logprobs)."""
    requests = []
    for i, (prompt, num_rows) in enumerate(tails):
        request = engine.add_request(f"tail-{i}", prompt, SamplingParams(max_tokens=1, temperature=0.0))
        request.num_tail_logit_rows = num_rows
        requests.append(request)
    prompt, max_tokens = decode
    engine.add_request("decode", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0,
                                                        ignore_eos=True))
    generated, logprobs = [], []
    while engine.has_unfinished():
        for output in engine.step():
            if output.request_id == "decode":
                generated += output.new_token_ids
                logprobs += output.logprobs
    return [collect_tail_logits(request) for request in requests], generated, logprobs


def _max_model_len(name: str) -> int | None:
    # Phi-3's longrope: short factors while the served context is within the original one (as transformers
    # does for sequences that short); test_phi3_long_context takes the long factors
    return PHI3_ORIGINAL_CONTEXT if name == "phi3" else None


def test_family_logits_match_transformers(family, backend):
    name, model_dir, hf_model = family
    engine = _engine(model_dir, backend, max_model_len=_max_model_len(name))
    prompt = _tokens(1, 40)
    expected = reference_logits(hf_model, prompt)
    assert expected.std() > 0.5  # not flat: a wrong op shows

    cold = engine.prompt_tail_logits(prompt, len(prompt))  # in chunks of <= 16 tokens
    assert (cold - expected).abs().max().item() <= ATOL

    shared = prompt[:28] + _tokens(2, 10)  # 28 cached tokens (7 pages), past every sliding window
    prefilled = engine.metrics.num_prefill_tokens
    cached = engine.prompt_tail_logits(shared, 10)
    assert engine.metrics.num_prefill_tokens - prefilled == 10
    assert (cached - reference_logits(hf_model, shared)[-10:]).abs().max().item() <= ATOL

    fresh, partly_cached, to_decode = _tokens(3, 30), prompt[:20] + _tokens(4, 13), prompt[:12] + _tokens(5, 9)
    (fresh_logits, partly_cached_logits), generated, logprobs = _run_together(
        engine, [(fresh, 30), (partly_cached, 13)], (to_decode, 6))
    assert (fresh_logits - reference_logits(hf_model, fresh)).abs().max().item() <= ATOL
    assert (partly_cached_logits - reference_logits(hf_model, partly_cached)[-13:]).abs().max().item() <= ATOL
    full = reference_logits(hf_model, to_decode + generated)
    expected_logprobs = torch.log_softmax(full[len(to_decode) - 1 : -1], dim=-1)
    assert len(generated) == 6
    for step, (token, logprob) in enumerate(zip(generated, logprobs)):
        assert abs(expected_logprobs[step, token].item() - logprob) <= ATOL
        assert expected_logprobs[step, token].item() >= expected_logprobs[step].max().item() - ATOL  # greedy
    stats = engine.stats()
    assert stats.num_free_pages + stats.num_cached_pages == stats.num_pages


@pytest.mark.parametrize("name", WINDOWED)
def test_a_cached_prefix_across_the_window_gives_a_cold_prefills_logits(name, tmp_path, backend):
    """The prompt is longer than the window, and so is its cached prefix: every sliding layer's
    mask must hide the cached keys that fell out of the window exactly as in a cold prefill."""
    hf_model = make_tiny(name, tmp_path)
    prompt = _tokens(7, 5 * WINDOW)
    cold = _engine(tmp_path, backend, enable_prefix_cache=False).prompt_tail_logits(prompt, len(prompt))
    engine = _engine(tmp_path, backend)
    engine.prompt_tail_logits(prompt[: 3 * WINDOW + 2], 1)  # caches 3 windows' worth of pages
    prefilled = engine.metrics.num_prefill_tokens
    warm = engine.prompt_tail_logits(prompt, 2 * WINDOW)
    assert engine.metrics.num_prefill_tokens - prefilled == 2 * WINDOW  # 3 * WINDOW tokens came from the cache
    assert (warm - cold[-2 * WINDOW :]).abs().max().item() <= 1e-5
    assert (cold - reference_logits(hf_model, prompt)).abs().max().item() <= ATOL


def test_phi3_long_context(tmp_path, backend):
    """Served past its original context, Phi-3 rotates every position with longrope's long factors,
    as transformers does for a sequence that long."""
    hf_model = make_tiny("phi3", tmp_path)
    prompt = _tokens(8, PHI3_ORIGINAL_CONTEXT + 12)
    engine = _engine(tmp_path, backend)
    engine.prompt_tail_logits(prompt[:30], 1)
    logits = engine.prompt_tail_logits(prompt, 30)
    assert (logits - reference_logits(hf_model, prompt)[-30:]).abs().max().item() <= ATOL


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_speculation_keeps_greedy_outputs_on_windowed_families(name, tmp_path):
    make_tiny(name, tmp_path)
    prompt = _tokens(9, 12) * 3  # repeats: n-gram drafts find matches
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    plain = _engine(tmp_path, "cpu").generate([prompt], params)
    speculative = _engine(tmp_path, "cpu", speculation=SpeculationConfig("ngram"))
    assert speculative.generate([prompt], params) == plain
    assert speculative.metrics.num_draft_tokens > 0


def test_the_cpu_backend_runs_every_family_on_its_fused_kernels():
    """GeGLU, soft caps, sliding windows and partial rotary dimensions all have their C kernels:
    no fallback for Gemma 2 or Phi-3."""
    from model.backends import select_backend
    from model.config import ModelConfig
    from store.model_store import radixserve_home

    base = dict(architecture="Gemma2ForCausalLM", vocab_size=128, hidden_size=64, intermediate_size=96,
                num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                rope_scaling=None, max_position_embeddings=128, tie_word_embeddings=True, has_qkv_bias=False)
    gemma2 = ModelConfig(**base, hidden_act="gelu_tanh", layer_windows=(8, None), attn_logit_softcap=50.0)
    phi3 = ModelConfig(**{**base, "architecture": "Phi3ForCausalLM"}, partial_rotary_factor=0.5)
    for config in (gemma2, phi3):
        backend = select_backend("cpu", torch.float32, config, "cpu", build_dir=radixserve_home() / "kernels")
        if backend.ops is None:
            pytest.skip("the fused C ops do not build here")
        # nothing falls back but what this CPU's instruction sets leave out
        assert all("this CPU lacks" in line for line in backend.plan().fallbacks), backend.plan().fallbacks
        assert backend.plan().row_ops == "fused C kernels"


@pytest.mark.parametrize("name", ["gemma3", "phi3", "llama3"])
def test_document_reuse_re_rotates_each_layer_by_its_own_rope(name, tmp_path, backend):
    """A stored span placed at a new position: layer 0's K depends only on token and position, so the
    re-rotated K equals the K a plain prefill computes there, with Gemma 3's local RoPE (its layer 0
    slides) and Phi-3's partial rotary dimensions alike."""
    from engine.request_options import RequestOptions
    from kernels.attention_inputs import slot_ids_of

    make_tiny(name, tmp_path)
    doc, question = _tokens(10, 24), _tokens(11, 4)

    def prompt(system_len: int):
        system = _tokens(12 + system_len, system_len)
        return system + doc + question, RequestOptions(document_reuse=True,
                                                       document_spans=((system_len, system_len + len(doc)),))

    def layer0_k_after_prefill(engine, tokens, options):
        request = engine.add_request(f"r{engine.num_steps}", tokens, SamplingParams(max_tokens=2, temperature=0.0),
                                     None, options)
        while request.num_computed_tokens < len(tokens):
            engine.step()
        slots = torch.tensor(slot_ids_of(request.page_ids, 0, len(tokens), 4))
        k = engine.kv_pool.layers[0].k.gather(slots, torch.float32)
        while engine.has_unfinished():
            engine.step()
        return k

    documents = DocumentReuseConfig(min_span_tokens=8, boundary_tokens=2)
    settings = dict(max_num_batched_tokens=256, documents=documents, max_model_len=_max_model_len(name))
    engine = _engine(tmp_path, backend, **{**settings, "documents": replace(documents, enabled=True)})
    layer0_k_after_prefill(engine, *prompt(5))  # stores the span at positions 5..28
    moved, options = prompt(11)  # the span at 11..34
    placed = layer0_k_after_prefill(engine, moved, options)
    assert engine.stats().documents.num_reused_tokens > 0
    plain = layer0_k_after_prefill(_engine(tmp_path, backend, **settings), moved, RequestOptions(document_reuse=False))
    torch.testing.assert_close(placed, plain, atol=1e-4, rtol=1e-4)

"""The cpu backend's bfloat16 prefill over GGUF blocks (EngineConfig.prefill_dtype): named in describe(),
close to float32; bf16 products (AMX) agree with themselves batched and alone, chunked and cached, bit for
bit; bf16 tensors hold a copy of the projections at half float32's bytes."""

import pytest
import torch

from engine.engine_config import EngineConfig
from engine.generate import greedy_generate
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from kernels.cpu_features import this_cpu
from kernels.packed_linear import bf16_is_available
from store.gguf_import import convert_gguf
from tests.engine.test_engine_batching import _mixed_prompts

pytestmark = pytest.mark.skipif(not (bf16_is_available() and this_cpu().has_native_bf16()),
                                reason="this CPU (or torch's oneDNN) has no native bf16 GEMM")


@pytest.fixture(scope="module")
def quantized_tiny_dir(tmp_path_factory):
    from tests.conftest import write_tiny_gguf

    root = tmp_path_factory.mktemp("quantized-tiny-bf16")
    write_tiny_gguf(root / "tiny.gguf", quantized=True)
    convert_gguf(root / "tiny.gguf", root / "model", progress=False)
    return root / "model"


def _engine(model_dir, prefill_dtype: str, float_prefill_max_bytes: int) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", backend="cpu",
                                  kv_cache_bytes=64 << 20, max_num_batched_tokens=48, prefill_dtype=prefill_dtype,
                                  float_prefill_max_bytes=float_prefill_max_bytes))


@pytest.fixture(params=["amx", "products", "tensors"])
def bf16_math(request, monkeypatch):
    """bf16 products where oneDNN runs them (AMX): over the blocks on AMX tiles ("amx", kernels/amx_gemm.py), or
    with that GEMM off over oneDNN's tiles ("products"); bf16 tensors, forced by hiding the products, on any
    native-bf16 CPU. Returns how describe() names the prefill GEMMs' math: "products" or "tensors"."""
    from kernels import amx_gemm, bf16_products
    from kernels.native_build import NativeUnavailable
    from store.model_store import radixserve_home

    if request.param != "tensors" and not bf16_products.run_here():
        pytest.skip("oneDNN runs no bf16 products in float32 GEMMs here (needs AMX)")
    if request.param == "amx":
        try:
            amx_gemm.load(radixserve_home() / "kernels")
        except NativeUnavailable as error:
            pytest.skip(str(error))
        return "amx"

    def refuse(*args, **kwargs):
        raise NativeUnavailable("blocks_amx: off for this test")

    monkeypatch.setattr(amx_gemm, "load", refuse)
    if request.param == "tensors":
        monkeypatch.setattr(bf16_products, "run_here", lambda: False)
    return request.param


@pytest.mark.parametrize("copy_bytes, path", [(1 << 30, "oneDNN prepacked over a {} copy of Q4_1 blocks"),
                                               (0, "torch GEMM over dequantized tiles of Q4_1 blocks")])
def test_bf16_prefill_is_named_close_to_float32_and_batched_equals_alone(quantized_tiny_dir, copy_bytes, path,
                                                                          bf16_math):
    """A budget of 48 tokens: prefill chunks of many rows (bf16; over tiles above 32) and decodes of few (float32 blocks kernels)
    share steps."""
    engine = _engine(quantized_tiny_dir, "bfloat16", copy_bytes)
    plan = engine.backend.plan()
    on_amx, bf16_math = bf16_math == "amx", "tensors" if bf16_math == "tensors" else "products"
    copy_dtype = "float32" if bf16_math == "products" else "bfloat16"
    # (the default int16 decode keeps a copy of the Q4_1 projections in interleaved rows: the AMX GEMM reads it)
    expected = ("AMX GEMM over Q4_1 blocks (bf16 products; Q4_1 panels from the decode copy)" if on_amx and not copy_bytes
                else path.format(copy_dtype) + f" (bfloat16 {bf16_math})")
    assert plan.linears["layers.0.mlp.gate_up_proj"].large == expected
    assert f"prefill GEMMs: bfloat16 {bf16_math}" in engine.backend.describe()
    reference = _engine(quantized_tiny_dir, "float32", copy_bytes)
    if copy_bytes:  # a copy in bf16 holds half the bytes of the float32 one; bf16 products read float32's
        notes = [[n for n in e.backend.plan().notes if "copies of the projections" in n][0] for e in (engine, reference)]
        assert f"prefill over {copy_dtype} copies" in notes[0] and "prefill over float32 copies" in notes[1]
        assert (engine.backend._float_prefill_bytes < reference.backend._float_prefill_bytes) == (bf16_math == "tensors")
    # the logits stay float32 (cpu_backend.BF16_FLOAT_LAYERS)
    assert "bfloat16" not in plan.linears["lm_head"].large

    ids = torch.tensor(_mixed_prompts(256)[0])
    bf16_logits, float_logits = (e.prompt_tail_logits(ids.tolist(), 40) for e in (engine, reference))
    # x and weights rounded to bf16 (8 bits of mantissa), and the outputs too over bf16 tensors, layer after layer
    assert (bf16_logits - float_logits).abs().max() < 0.05 * float_logits.abs().max()
    assert not torch.equal(bf16_logits, float_logits)  # the bf16 GEMM did run

    if bf16_math == "tensors":  # their rows depend on the GEMM's row count: batched need not equal alone
        return
    prompts = _mixed_prompts(256)[:8]
    expected = [greedy_generate(engine.model, p, 8) for p in prompts]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert outputs == expected


@pytest.mark.parametrize("copy_bytes", [1 << 30, 0])
def test_bf16_products_give_a_prompts_last_row_the_same_bits_however_chunked_or_cached(smollm2_dir, copy_bytes):
    """Prompt rows run the bf16 GEMM and the prefill attention kernel at any chunk size, and both compute a row
    alike whatever rows share the call: so chunking and a cached prefix change no bit of the logits. (The default
    model: every projection is blocks; a float weight, as the tiny model's down_proj, multiplies in float32.)"""
    from kernels import bf16_products

    if not bf16_products.run_here():
        pytest.skip("oneDNN runs no bf16 products in float32 GEMMs here (needs AMX)")
    ids = sum(_mixed_prompts(256)[:4], [])[:150]

    def engine(budget: int, prefix_cache: bool) -> LLMEngine:
        return LLMEngine(EngineConfig(model_dir=smollm2_dir, device="cpu", dtype="float32", backend="cpu",
                                      kv_cache_bytes=64 << 20, max_num_batched_tokens=budget,
                                      prefill_dtype="bfloat16", float_prefill_max_bytes=copy_bytes,
                                      enable_prefix_cache=prefix_cache))

    # one chunk; chunks of 24 (the last of 6 rows); chunks of 7
    logits = [engine(budget, False).prompt_tail_logits(ids, 1) for budget in (512, 24, 7)]
    cached = engine(512, True)
    for shared in (100, 147, 149):  # a cached prefix of that many tokens' full pages, the rest computed
        cached.prompt_tail_logits(ids[:shared] + [3, 4, 5], 1)
        logits.append(cached.prompt_tail_logits(ids, 1))
    assert all(torch.equal(other, logits[0]) for other in logits[1:])


def test_by_default_bf16_products_keep_no_copy_of_the_projections_and_float32_does(quantized_tiny_dir, bf16_math):
    """float_prefill_max_bytes None: under bf16 products prefill runs over tiles of the blocks (their
    speed is near the copy's: cpu_backend.FLOAT_PREFILL_MAX_BYTES), float32 keeps its copy."""
    def engine(prefill_dtype):
        return LLMEngine(EngineConfig(model_dir=quantized_tiny_dir, device="cpu", dtype="float32", backend="cpu",
                                      kv_cache_bytes=64 << 20, prefill_dtype=prefill_dtype))

    bf16, float32 = engine("bfloat16").backend, engine("float32").backend
    assert float32._float_prefill_bytes > 0
    assert (bf16._float_prefill_bytes == 0) == (bf16_math != "tensors")


def test_prefill_attention_in_bf16_on_amx_where_the_projections_run_bf16_products(quantized_tiny_dir, tiny_llama_dir):
    """A model whose projections prefill over blocks in bf16 products runs prefill attention on the AMX build (or
    says why not); a float32 model (float32 GEMMs) keeps the float32 build, and so does prefill_attention
    "float32"."""
    from kernels import bf16_products
    from kernels.cpu_prefill_attention import AMX_BF16

    if not bf16_products.run_here():
        pytest.skip("oneDNN runs no bf16 products in float32 GEMMs here (needs AMX)")
    backend = _engine(quantized_tiny_dir, "auto", 0).backend
    if backend.prefill_attention.instruction_set == AMX_BF16:
        assert ("prefill attention: C kernel over pages (amx_bf16: bf16 products on AMX tiles, float32 softmax)"
                in backend.describe())
    else:
        assert any(line.startswith("bf16 prefill attention off") for line in backend.plan().fallbacks)
    for model_dir, choice in ((tiny_llama_dir, "auto"), (quantized_tiny_dir, "float32")):
        backend = LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", backend="cpu",
                                         kv_cache_bytes=64 << 20, prefill_attention=choice)).backend
        assert backend.prefill_attention.instruction_set != AMX_BF16

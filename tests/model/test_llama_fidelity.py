"""Our Llama-family model against transformers on the same weights, once per backend."""

import pytest
import torch
import transformers

from engine.generate import greedy_generate, load
from model.weights import load_model
from tests.model.hf_reference import hf_reference_model
from tests.conftest import DEFAULT_BACKEND_FIRST

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)

VARIANTS = {
    "llama-tied": (transformers.LlamaConfig, dict(tie_word_embeddings=True)),
    "llama-untied": (transformers.LlamaConfig, dict(tie_word_embeddings=False)),
    "llama3-rope-scaling": (
        transformers.LlamaConfig,
        dict(
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "qwen2-bias": (transformers.Qwen2Config, dict(tie_word_embeddings=False)),
    "mistral": (transformers.MistralConfig, dict(sliding_window=None)),
}


def _hf_model_class(config):
    return {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "mistral": transformers.MistralForCausalLM,
    }[config.model_type]


@pytest.fixture(params=sorted(VARIANTS))
def tiny_model_dir(request, tmp_path):
    config_class, extra = VARIANTS[request.param]
    torch.manual_seed(0)
    config = config_class(**TINY, **extra)
    hf_model = _hf_model_class(config)(config).eval()
    with torch.no_grad():  # non-trivial norms and biases
        for name, param in hf_model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    hf_model.save_pretrained(tmp_path)
    return tmp_path, hf_model


def _our_logits(model, token_ids: list[int], chunk_sizes: list[int]) -> torch.Tensor:
    """Logits of every position, feeding the prompt in the given chunks so the
    later chunks attend to KV already in pages."""
    from cache.kv_pool import KVPool, KVPoolShape
    from engine.step_batch import SequenceChunk, build_step_batch

    config = model.config
    page_size = 4
    num_pages = len(token_ids) // page_size + 2
    dtype = model.norm.weight.dtype  # (the embedding may be GGUF blocks)
    shape = KVPoolShape(config.num_layers, config.num_kv_heads, config.head_dim, page_size, dtype)
    pool = KVPool(shape, num_pages, torch.device("cpu"))
    # Pages deliberately out of order: the model must only go through the table.
    page_ids = list(reversed(range(num_pages)))
    rows, start = [], 0
    for size in chunk_sizes:
        batch = build_step_batch([SequenceChunk(token_ids[start : start + size], start, page_ids)], page_size,
                                 torch.device("cpu"))
        hidden = model(batch.input_ids, batch.attn.positions, pool.layers, batch.attn)
        rows.append(model.compute_logits(hidden))  # every row, not only the step's logit row
        start += size
    return torch.cat(rows)


@pytest.mark.parametrize("chunks", [[37], [10, 1, 26], [16, 16, 5]])
def test_tiny_logits_match_transformers(tiny_model_dir, chunks, backend):
    model_dir, hf_model = tiny_model_dir
    token_ids = torch.randint(0, TINY["vocab_size"], (37,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        expected = hf_model(torch.tensor([token_ids])).logits[0].float()
    ours = _our_logits(load_model(model_dir, torch.device("cpu"), torch.float32, backend=backend), token_ids, chunks)
    assert (ours - expected).abs().max().item() <= 1e-4


def test_tiny_backend_and_reference_agree(tiny_model_dir, backend):
    model_dir, _ = tiny_model_dir
    token_ids = list(range(1, 30))
    plain = _our_logits(load_model(model_dir, torch.device("cpu"), torch.float32, backend="torch"), token_ids, [29])
    model = load_model(model_dir, torch.device("cpu"), torch.float32, backend=backend)
    ours = _our_logits(model, token_ids, [20, 9])
    assert (ours - plain).abs().max().item() <= 1e-4


def test_tiny_bf16_close_to_fp32(tiny_model_dir):
    model_dir, _ = tiny_model_dir
    token_ids = list(range(1, 30))
    fp32 = _our_logits(load_model(model_dir, torch.device("cpu"), torch.float32), token_ids, [29])
    bf16_model = load_model(model_dir, torch.device("cpu"), torch.bfloat16)
    assert bf16_model.embed_tokens.weight.dtype == torch.bfloat16
    bf16 = _our_logits(bf16_model, token_ids, [20, 9])
    # bf16 keeps ~3 significant digits; the logits stay within a few percent of their spread.
    assert (bf16 - fp32).abs().max().item() <= 0.05 * (fp32.max() - fp32.min()).item()


@pytest.fixture(scope="module")
def smollm2_hf_model(smollm2_dir):
    """transformers' model of the default model (~6 s to build: its weights dequantized), once for this module."""
    return hf_reference_model(smollm2_dir)


SMOLLM2_TOKEN_IDS = torch.randint(0, 49152, (200,), generator=torch.Generator().manual_seed(2)).tolist()


@pytest.fixture(scope="module")
def smollm2_hf_logits(smollm2_hf_model):
    """transformers' logits of SMOLLM2_TOKEN_IDS, [200, vocab]: every backend is compared with the same ones."""
    with torch.no_grad():
        return smollm2_hf_model(torch.tensor([SMOLLM2_TOKEN_IDS])).logits[0].float()


@pytest.mark.model
def test_smollm2_logits_match_transformers(smollm2_dir, backend, smollm2_hf_logits):
    ours = _our_logits(load(smollm2_dir, dtype="float32", device="cpu", backend=backend), SMOLLM2_TOKEN_IDS, [200])
    assert (ours - smollm2_hf_logits).abs().max().item() <= 1e-3


CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Give me three tips for sleeping better.",
]


@pytest.mark.model
@pytest.mark.parametrize("backend", DEFAULT_BACKEND_FIRST, indirect=True)
def test_smollm2_greedy_matches_transformers(smollm2_dir, backend, smollm2_hf_model):
    from assembly.chat_template import ChatTemplate
    from assembly.tokenizer import Tokenizer

    template = ChatTemplate.from_model_dir(smollm2_dir)
    tokenizer = Tokenizer(smollm2_dir)
    model = load(smollm2_dir, dtype="float32", device="cpu", backend=backend)
    for prompt in CHAT_PROMPTS:
        prompt_ids = tokenizer.encode(template.render([{"role": "user", "content": prompt}]))
        with torch.no_grad():
            hf_out = smollm2_hf_model.generate(
                torch.tensor([prompt_ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
            )[0, len(prompt_ids) :].tolist()
        ours = greedy_generate(model, prompt_ids, 32)
        assert ours == hf_out, prompt

"""Shared fixtures: the real default model (pulled once, cached under $RADIXSERVE_HOME)
and a writer of tiny GGUF files for conversion tests."""

import os
from pathlib import Path

import numpy as np
import pytest

from store import model_store

DEFAULT_MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct directory; the first run downloads and converts it."""
    return model_store.pull(DEFAULT_MODEL, progress=False)


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_dir) -> Path:
    """The GGUF file smollm2_dir was converted from (the reference input for transformers)."""
    return model_store.extract_gguf(DEFAULT_MODEL, progress=False)


# --- tiny GGUF files -------------------------------------------------------------------------

TINY_SHAPE = dict(hidden=32, intermediate=48, num_layers=2, num_heads=4, num_kv_heads=2)
TINY_MERGES = ["Ġ t", "h e", "Ġt he"]
TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def _byte_level_tokens() -> list[str]:
    """GPT-2's 256 one-byte tokens, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, next_free = {}, 256
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(next_free)
            next_free += 1
    return [chars[b] for b in range(256)]


def permute_for_llama_cpp(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's q/k permutation: per head, rows (2, pair) -> (pair, 2)."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    *,
    tie_word_embeddings: bool = True,
    qkv_bias: bool = False,
    seed: int = 0,
    quantized: bool = False,
) -> dict[str, np.ndarray]:
    """Write a tiny random model to `path` as llama.cpp would; return its HF-layout state dict.

    `quantized` stores the token embedding as Q8_0 and every other matrix whose rows are whole
    32-weight blocks as Q4_1 (down_proj, 48 wide, stays float32); the returned weights are then
    the dequantized values."""
    import gguf
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(seed)
    s = TINY_SHAPE
    head_dim = s["hidden"] // s["num_heads"]
    tokens = _byte_level_tokens() + ["Ġt", "he", "Ġthe"] + TINY_SPECIALS
    token_types = [1] * (len(tokens) - len(TINY_SPECIALS)) + [3] * len(TINY_SPECIALS)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.1

    hf = {"model.embed_tokens.weight": rand(len(tokens), s["hidden"]), "model.norm.weight": 1 + rand(s["hidden"])}
    if not tie_word_embeddings:
        hf["lm_head.weight"] = rand(len(tokens), s["hidden"])
    q_rows, kv_rows = s["num_heads"] * head_dim, s["num_kv_heads"] * head_dim
    for i in range(s["num_layers"]):
        p = f"model.layers.{i}."
        hf[p + "input_layernorm.weight"] = 1 + rand(s["hidden"])
        hf[p + "post_attention_layernorm.weight"] = 1 + rand(s["hidden"])
        for name, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
            hf[p + f"self_attn.{name}_proj.weight"] = rand(rows, s["hidden"])
            if qkv_bias:
                hf[p + f"self_attn.{name}_proj.bias"] = rand(rows)
        hf[p + "self_attn.o_proj.weight"] = rand(s["hidden"], q_rows)
        hf[p + "mlp.gate_proj.weight"] = rand(s["intermediate"], s["hidden"])
        hf[p + "mlp.up_proj.weight"] = rand(s["intermediate"], s["hidden"])
        hf[p + "mlp.down_proj.weight"] = rand(s["hidden"], s["intermediate"])

    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(s["num_layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(s["hidden"])
    writer.add_feed_forward_length(s["intermediate"])
    writer.add_head_count(s["num_heads"])
    writer.add_head_count_kv(s["num_kv_heads"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(TINY_MERGES)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_unk_token_id(tokens.index("<|endoftext|>"))
    writer.add_pad_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(TINY_CHAT_TEMPLATE)
    for hf_name, array in hf.items():
        gguf_array = _to_gguf_layout(hf_name, array, arch)
        block_format = None
        if quantized and array.ndim == 2 and array.shape[1] % 32 == 0:
            block_format = gguf.GGMLQuantizationType.Q8_0 if "embed_tokens" in hf_name else gguf.GGMLQuantizationType.Q4_1
        if block_format is None:
            writer.add_tensor(_gguf_name(hf_name), gguf_array)
            continue
        blocks = quantize(gguf_array, block_format)
        writer.add_tensor(_gguf_name(hf_name), blocks, raw_dtype=block_format)
        # what a reader gets back, in HF layout (the permutation only moves rows)
        hf[hf_name] = _from_gguf_layout(hf_name, dequantize(blocks, block_format).astype(np.float32), arch)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


def _to_gguf_layout(hf_name: str, array: np.ndarray, arch: str) -> np.ndarray:
    if arch != "llama":  # qwen2 keeps HF's rope layout
        return array
    if ".q_proj." in hf_name:
        return permute_for_llama_cpp(array, TINY_SHAPE["num_heads"])
    if ".k_proj." in hf_name:
        return permute_for_llama_cpp(array, TINY_SHAPE["num_kv_heads"])
    return array


def _from_gguf_layout(hf_name: str, array: np.ndarray, arch: str) -> np.ndarray:
    if arch != "llama":
        return array
    for part, heads in ((".q_proj.", TINY_SHAPE["num_heads"]), (".k_proj.", TINY_SHAPE["num_kv_heads"])):
        if part in hf_name:
            head_dim = array.shape[0] // heads
            return array.reshape(heads, head_dim // 2, 2, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape)
    return array


_GGUF_NAMES = {
    "model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf_name: str) -> str:
    stem, _, suffix = hf_name.rpartition(".")
    if stem in _GGUF_NAMES:
        return f"{_GGUF_NAMES[stem]}.{suffix}"
    _, _, layer, module = stem.split(".", 3)  # model.layers.N.<module>
    return f"blk.{layer}.{_GGUF_NAMES[module]}.{suffix}"


@pytest.fixture
def tiny_gguf():
    """`write_tiny_gguf` (see above): write a tiny llama/qwen2 GGUF, get its HF state dict back."""
    return write_tiny_gguf


# Engine tests run on the CPU unless RADIXSERVE_TEST_DEVICE names another
# device (e.g. cuda, on a machine with a GPU).
TEST_DEVICE = os.environ.get("RADIXSERVE_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def engine_device() -> str:
    return TEST_DEVICE


# Engine and model tests run once per execution backend (model/backends). `cpu-no-compiler` is
# `cpu` as a machine without a C compiler gets it: forced here, so the fallback always runs.
BACKENDS = ("torch", "cpu", "cpu-no-compiler") if TEST_DEVICE == "cpu" else ("torch",)
# For the heaviest default-model tests: the default backend in `make test`, the others marked `extended`
# (make test-extended), since every backend already runs the same checks on the tiny models there.
DEFAULT_BACKEND_FIRST = [name if name == BACKENDS[min(1, len(BACKENDS) - 1)] else
                         pytest.param(name, marks=pytest.mark.extended) for name in BACKENDS]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch) -> str:
    """The backend name to load with (EngineConfig.backend, load_model's backend)."""
    if request.param == "cpu-no-compiler":
        from kernels import native_build

        monkeypatch.setattr(native_build, "find_compiler", lambda: None)
        return "cpu"
    return request.param


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """A small random Llama (GQA 4/2 heads, 2 layers, vocab 256) saved by
    transformers: fast engine tests whose outputs are deterministic."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    path = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture
def unsupported_gguf(tmp_path) -> Path:
    """A minimal GGUF of an architecture the converter refuses (gptneox)."""
    import gguf

    path = tmp_path / "neox.gguf"
    writer = gguf.GGUFWriter(path, "gptneox")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

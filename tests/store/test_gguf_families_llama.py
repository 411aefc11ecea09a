"""GGUF files made by llama.cpp's own tools, per family and weight type, imported: config.json
holds what the source model's config says, every tensor is the source's within its type's
quantization, the tokenizer encodes as the source model's HF tokenizer, the chat template is
carried. Marked llama_tools (make test-llama); the made files are cached outside the repository."""

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from store.block_file import read_block_file
from store.checkpoint_names import GGUF_CONFIG_TENSORS, hf_tensor_name
from tests.llama_made_models import FAMILIES, GGUF_TYPES, imported_dir, made_model
from tests.llama_tools import llama_cpp_dir, require_llama_tools

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.llama_tools

TEXTS = [
    "Hello world",
    " Hello world",
    "  two leading spaces, then\ttab\nnewline\n\n  and 12345 digits 3.14",
    "naïve café déjà vu — 日本語のテキスト, Ελληνικά, русский текст 🦙🦙",
    "trailing spaces   ",
    "",
]
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there! 2+2=?"},
            {"role": "assistant", "content": " Four.  "}, {"role": "user", "content": "And émoji 🦙?"}]
# relative RMS error of a dequantized matrix against the source, by the file's block type
_QUANT_REL_RMS = {"BF16": 0.005, "Q8_0": 0.01, "Q6_K": 0.03, "Q5_0": 0.06, "Q5_1": 0.06, "Q5_K": 0.06,
                  "Q4_0": 0.12, "Q4_1": 0.12, "Q4_K": 0.12, "Q3_K": 0.25, "Q2_K": 0.45}


@lru_cache(maxsize=None)
def _made(family: str):
    return made_model(require_llama_tools(), family)


@lru_cache(maxsize=None)
def _imported(family: str, gguf_type: str) -> Path:
    return imported_dir(_made(family), family, gguf_type)


def _tensors(path: Path) -> dict[str, np.ndarray]:
    with safe_open(str(path), "np") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


CASES = [(family, gguf_type) for family in FAMILIES for gguf_type in GGUF_TYPES]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_config_matches_the_source_model(family):
    made = _made(family)
    source = transformers.AutoConfig.from_pretrained(made.hf_dir)
    config = json.loads((_imported(family, "F16") / "config.json").read_text())
    hf_class = transformers.AutoModelForCausalLM._model_mapping[type(source)].__name__
    if family == "mistral":  # llama.cpp converts Mistral as llama: the file cannot tell them apart
        hf_class, source_model_type = "LlamaForCausalLM", "llama"
    else:
        source_model_type = source.model_type
    assert config["architectures"] == [hf_class]
    assert config["model_type"] == source_model_type
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings",
                "bos_token_id", "eos_token_id", "pad_token_id"):
        assert config[key] == getattr(source, key), key
    assert config["head_dim"] == getattr(source, "head_dim", source.hidden_size // source.num_attention_heads)
    assert config["rms_norm_eps"] == pytest.approx(source.rms_norm_eps, rel=1e-6)
    assert config["hidden_act"] == (getattr(source, "hidden_activation", None) or source.hidden_act)
    assert config["attention_bias"] == getattr(source, "attention_bias", source.model_type == "qwen2")
    rope = source.rope_parameters
    global_rope = rope.get("full_attention", rope)
    assert config["rope_theta"] == pytest.approx(global_rope["rope_theta"], rel=1e-6)

    if family == "llama3":
        # our per-frequency divisors reproduce transformers' llama3 frequencies
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        scaled_inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](source, "cpu")
        dim = source.head_dim
        inv_freq = 1.0 / (global_rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        assert config["rope_scaling"]["rope_type"] == "freq_factors"
        factors = torch.tensor(config["rope_scaling"]["factors"], dtype=torch.float64)
        torch.testing.assert_close(inv_freq / factors, scaled_inv_freq.to(torch.float64), rtol=1e-5, atol=0)
        assert not torch.all(factors == 1)  # the test model's scaling touches some frequencies
    elif family in ("gemma2", "gemma3"):
        for key in ("query_pre_attn_scalar", "sliding_window", "layer_types", "final_logit_softcapping",
                    "attn_logit_softcapping"):
            assert config[key] == getattr(source, key), key
        if family == "gemma3":
            assert config["rope_local_base_freq"] == rope["sliding_attention"]["rope_theta"]
        assert "rope_scaling" not in config
    elif family == "phi3":
        assert config["partial_rotary_factor"] == rope["partial_rotary_factor"]
        assert config["original_max_position_embeddings"] == source.original_max_position_embeddings
        assert config["sliding_window"] == source.sliding_window
        assert config["rope_scaling"]["rope_type"] == "longrope"
        for key in ("long_factor", "short_factor"):
            assert config["rope_scaling"][key] == pytest.approx(rope[key], rel=1e-6)
    else:
        assert "rope_scaling" not in config
    generation = json.loads((made.hf_dir / "generation_config.json").read_text())
    ours = json.loads((_imported(family, "F16") / "generation_config.json").read_text())
    assert ours["eos_token_id"] == generation["eos_token_id"]


@pytest.mark.parametrize(("family", "gguf_type"), CASES)
def test_tensors_match_the_source_within_the_type(family, gguf_type):
    made = _made(family)
    source = _tensors(made.hf_dir / "model.safetensors")
    out = _imported(family, gguf_type)
    # model.safetensors holds the float32 tensors, gguf_blocks.safetensors the rest as the file's blocks
    ours = _tensors(out / "model.safetensors")
    for name, blocks in read_block_file(out).items():
        assert name not in ours, name
        ours[name] = dequantize(blocks.rows, GGMLQuantizationType[blocks.format]).astype(np.float32).reshape(
            blocks.rows.shape[0], blocks.cols)
    assert sorted(ours) == sorted(source)
    config = json.loads((_imported(family, gguf_type) / "config.json").read_text())
    architecture = FAMILIES[family].gguf_architecture
    reader = GGUFReader(made.gguf_paths[gguf_type])
    file_tensors = {hf_tensor_name(t.name, architecture): t for t in reader.tensors
                    if t.name not in GGUF_CONFIG_TENSORS}
    assert sorted(file_tensors) == sorted(source)
    is_gemma = family.startswith("gemma")
    for name, want in source.items():
        tensor, got = file_tensors[name], ours[name]
        assert got.dtype == np.float32 and got.shape == want.shape, name
        kind = tensor.tensor_type.name
        if kind == "F32" or kind == "F16":
            expected = want.astype(np.float16).astype(np.float32) if kind == "F16" else want
            # Gemma's norms went through w + 1 in float32 and back
            atol = 2e-7 if is_gemma and name.endswith("norm.weight") else 0
            np.testing.assert_allclose(got, expected, rtol=0, atol=atol, err_msg=name)
            continue
        # a quantized matrix: exactly gguf's dequantization of the file's blocks, back in HF's row order ...
        from_file = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(want.shape)
        if architecture == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = config["num_attention_heads"] if ".q_proj." in name else config["num_key_value_heads"]
            from_file = from_file.reshape(heads, -1, 2, want.shape[1]).swapaxes(1, 2).reshape(want.shape)
        np.testing.assert_array_equal(got, from_file, err_msg=name)
        # ... and the source within that block type's error
        rel_rms = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
        assert rel_rms < _QUANT_REL_RMS[kind], (name, kind, rel_rms)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tokenizer_encodes_as_the_source_and_carries_the_template(family):
    from tokenizers import Tokenizer

    made = _made(family)
    source = transformers.AutoTokenizer.from_pretrained(made.hf_dir)
    for gguf_type in ("F16",):  # llama-quantize copies the metadata: every type's tokenizer is this one
        out = _imported(family, gguf_type)
        ours = Tokenizer.from_file(str(out / "tokenizer.json"))
        tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
        assert tokenizer_config["chat_template"] == source.chat_template
        chat = source.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        specials = "".join(source.all_special_tokens) + " after specials"
        for text in [*TEXTS, chat, specials]:
            assert ours.encode(text).ids == source(text)["input_ids"], (family, text)
            ids = source(text, add_special_tokens=False)["input_ids"]
            assert ours.decode(ids, skip_special_tokens=False) == source.decode(ids), (family, text)


@pytest.mark.parametrize("vocab", ["llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2"])
def test_llama_cpp_reference_vocabularies_encode_as_their_hf_tokenizers(vocab):
    """llama.cpp ships each real model's vocabulary as a GGUF with the ids its HF tokenizer gives
    for a set of hard strings (models/ggml-vocab-*.gguf.inp / .out)."""
    from store.gguf_import import read_metadata
    from store.gguf_tokenizer import build_tokenizer

    require_llama_tools()
    models = llama_cpp_dir() / "models"
    path = models / f"ggml-vocab-{vocab}.gguf"
    tokenizer = build_tokenizer(read_metadata(GGUFReader(path)), path)
    texts = (models / f"ggml-vocab-{vocab}.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    expected = (models / f"ggml-vocab-{vocab}.gguf.out").read_text().strip("\n").split("\n")
    assert len(expected) >= 40
    for text, ids in zip(texts, expected, strict=False):
        assert tokenizer.encode(text, add_special_tokens=False).ids == [int(i) for i in ids.split()], text

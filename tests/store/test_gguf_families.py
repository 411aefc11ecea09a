"""The pure parts of GGUF import per family: metadata -> config.json, GGUF -> HF tensor names,
the converter's changes undone, SentencePiece vocabularies. No llama.cpp needed (fast)."""

from pathlib import Path

import numpy as np
import pytest

from store.checkpoint_names import hf_tensor_name
from store.errors import ModelFormatError
from store.gguf_families import build_config, sliding_layers, undo_converter_changes
from store.gguf_import import generation_config
from store.gguf_tokenizer import build_tokenizer
from tests.conftest import permute_for_llama_cpp

PATH = Path("tiny.gguf")


def _metadata(arch: str, **keys) -> dict:
    metadata = {
        "general.architecture": arch,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.embedding_length": 256,
        f"{arch}.feed_forward_length": 512,
        f"{arch}.block_count": 6,
        f"{arch}.context_length": 8192,
        f"{arch}.attention.layer_norm_rms_epsilon": np.float32(1e-6),
        "tokenizer.ggml.tokens": ["a"] * 100,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
    }
    metadata.update({f"{arch}.{key}" if not key.startswith("tokenizer") else key: value
                     for key, value in keys.items()})
    return metadata


def test_unsupported_architecture_names_file_architecture_and_list():
    with pytest.raises(ModelFormatError, match=r"tiny\.gguf: architecture 'mamba' is not supported "
                                               r"\(supported: llama, qwen2, qwen3, gemma2, gemma3, phi3\)"):
        build_config(_metadata("mamba"), [], {}, PATH)


def test_llama3_rope_freqs_become_freq_factors():
    factors = np.array([1.0, 1.0, 2.5, 8.0], dtype=np.float32)
    config = build_config(_metadata("llama", **{"rope.freq_base": 500000.0}), ["output.weight"],
                          {"rope_freqs.weight": factors}, PATH)
    assert config["rope_scaling"] == {"rope_type": "freq_factors", "factors": [1.0, 1.0, 2.5, 8.0]}
    assert config["architectures"] == ["LlamaForCausalLM"] and config["rope_theta"] == 500000.0
    assert config["tie_word_embeddings"] is False and config["rms_norm_eps"] == 1e-6


def test_gemma3_defaults_follow_llama_cpp():
    config = build_config(_metadata("gemma3", **{"attention.key_length": 128, "attention.sliding_window": 512,
                                                 "rope.freq_base": 1e6}), [], {}, PATH)
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["model_type"] == "gemma3_text"
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert config["sliding_window"] == 512 and config["sliding_window_pattern"] == 6
    assert config["rope_theta"] == 1e6 and config["rope_local_base_freq"] == 10000.0
    assert config["query_pre_attn_scalar"] == 128 and config["head_dim"] == 128
    assert config["final_logit_softcapping"] is None and config["hidden_activation"] == "gelu_pytorch_tanh"


def test_gemma2_softcapping_window_and_27b_query_scale():
    keys = {"attention.key_length": 128, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
            "block_count": 46, "embedding_length": 4608, "attention.head_count": 32}
    config = build_config(_metadata("gemma2", **keys), [], {}, PATH)
    assert config["attn_logit_softcapping"] == 50.0 and config["final_logit_softcapping"] == 30.0
    assert config["sliding_window"] == 4096  # llama.cpp's default when the file has none
    assert config["layer_types"][:4] == ["sliding_attention", "full_attention"] * 2
    assert config["query_pre_attn_scalar"] == 4608 // 32  # the 27B shape: hidden / heads, not head_dim


def test_sliding_layer_patterns():
    assert sliding_layers(2, 4) == [True, False, True, False]
    assert sliding_layers(6, 7) == [True] * 5 + [False, True]
    assert sliding_layers([True, False, False], 3) == [True, False, False]
    assert sliding_layers(0, 2) == [True, True]


def test_phi3_partial_rotary_and_long_rope():
    long, short = np.linspace(1, 4, 24, dtype=np.float32), np.ones(24, dtype=np.float32)
    keys = {"rope.dimension_count": 48, "rope.scaling.original_context_length": 4096,
            "attention.sliding_window": 0, "context_length": 131072}
    tensors = {"rope_factors_long.weight": long, "rope_factors_short.weight": short}
    config = build_config(_metadata("phi3", **keys), ["output.weight"], tensors, PATH)
    assert config["partial_rotary_factor"] == 0.75 and config["head_dim"] == 64
    assert config["original_max_position_embeddings"] == 4096 and config["sliding_window"] is None
    assert config["rope_scaling"]["rope_type"] == "longrope"
    assert config["rope_scaling"]["long_factor"] == pytest.approx(long.tolist())
    with pytest.raises(ModelFormatError, match="the rotary dimensions need 24"):
        build_config(_metadata("phi3", **keys), [], {**tensors, "rope_factors_long.weight": long[:8]}, PATH)


def test_qwen3_q_k_norm_names_and_no_bias():
    config = build_config(_metadata("qwen3", **{"attention.key_length": 128}), [], {}, PATH)
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["head_dim"] == 128
    assert config["attention_bias"] is False
    assert hf_tensor_name("blk.1.attn_q_norm.weight", "qwen3") == "model.layers.1.self_attn.q_norm.weight"


def test_names_per_architecture():
    assert hf_tensor_name("blk.0.ffn_norm.weight", "llama") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_tensor_name("blk.0.ffn_norm.weight", "gemma3") == "model.layers.0.pre_feedforward_layernorm.weight"
    assert hf_tensor_name("blk.0.post_attention_norm.weight", "gemma2") == (
        "model.layers.0.post_attention_layernorm.weight")
    assert hf_tensor_name("blk.0.post_ffw_norm.weight", "gemma3") == "model.layers.0.post_feedforward_layernorm.weight"
    assert hf_tensor_name("blk.2.attn_qkv.weight", "phi3") == "model.layers.2.self_attn.qkv_proj.weight"
    assert hf_tensor_name("blk.2.ffn_up.weight", "phi3") == "model.layers.2.mlp.gate_up_proj.weight"
    assert hf_tensor_name("blk.2.ffn_up.weight", "qwen2") == "model.layers.2.mlp.up_proj.weight"
    assert hf_tensor_name("blk.0.post_ffw_norm.weight", "llama") is None


def test_converter_changes_undone():
    rng = np.random.default_rng(0)
    gemma = build_config(_metadata("gemma2"), [], {}, PATH)
    norm = rng.standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(undo_converter_changes(norm + 1, "model.layers.0.input_layernorm.weight", gemma),
                               norm, atol=1e-6)
    weight = rng.standard_normal((8, 8)).astype(np.float32)
    assert undo_converter_changes(weight, "model.layers.0.mlp.up_proj.weight", gemma) is weight
    llama = build_config(_metadata("llama"), [], {}, PATH)
    q = rng.standard_normal((256, 16)).astype(np.float32)
    np.testing.assert_array_equal(
        undo_converter_changes(permute_for_llama_cpp(q, 4), "model.layers.0.self_attn.q_proj.weight", llama), q)
    qwen = build_config(_metadata("qwen2"), [], {}, PATH)
    assert undo_converter_changes(q, "model.layers.0.self_attn.q_proj.weight", qwen) is q  # NeoX: unpermuted


def test_end_of_turn_also_ends_generation():
    metadata = {"tokenizer.ggml.eot_token_id": 106}
    assert generation_config(metadata, {"bos_token_id": 2, "eos_token_id": 1}) == {
        "bos_token_id": 2, "eos_token_id": [1, 106]}
    assert generation_config({}, {"bos_token_id": 2, "eos_token_id": 1}) == {"bos_token_id": 2, "eos_token_id": 1}


def _spm_metadata(add_space_prefix: bool) -> dict:
    # pieces as llama.cpp stores a SentencePiece-BPE vocabulary; scores fall with merge order
    normal = ["▁", "h", "e", "l", "o", "▁h", "he", "ll", "▁he", "▁hell", "hell", "o▁"]
    tokens = ["<unk>", "<s>", "</s>", "<|end|>", *[f"<0x{b:02X}>" for b in range(256)], *normal]
    types = [2, 3, 3, 3, *[6] * 256, *[1] * len(normal)]
    scores = [0.0] * 260 + [-float(i) for i in range(len(normal))]
    return {"general.architecture": "gemma2", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": add_space_prefix}


def test_sentencepiece_vocabulary_rebuilt():
    tokenizer = build_tokenizer(_spm_metadata(add_space_prefix=False), PATH)
    # merges by score: "▁h" (-5) before "he" (-6), so "▁hello" is ▁hell + o, not ▁ + hell + o
    assert tokenizer.encode("hello hello", add_special_tokens=False).tokens == ["hell", "o", "▁hell", "o"]
    # a character outside the vocabulary falls back to its UTF-8 bytes; special tokens whole
    assert tokenizer.encode("é<|end|>h").tokens == ["<s>", "<0xC3>", "<0xA9>", "<|end|>", "h"]
    assert tokenizer.decode(tokenizer.encode("hello é").ids, skip_special_tokens=True) == "hello é"


def test_sentencepiece_space_prefix_after_each_special_token():
    tokenizer = build_tokenizer(_spm_metadata(add_space_prefix=True), PATH)
    assert tokenizer.encode("hello<|end|>hello", add_special_tokens=False).tokens == [
        "▁hell", "o", "<|end|>", "▁hell", "o"]
    assert tokenizer.decode(tokenizer.encode("hello", add_special_tokens=False).ids) == "hello"

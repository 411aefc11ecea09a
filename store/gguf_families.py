"""What each model family's GGUF file means in HF terms: its config.json, and what
llama.cpp's converter (convert_hf_to_gguf.py) changed in its tensors that the import undoes.

The config is written the way the family's own config.json on the Hub spells it
(transformers 4.x keys: `rope_theta`, `rope_scaling`, `rope_local_base_freq`, ...,
which transformers 5 reads too), from the file's `{arch}.*` metadata keys and, for
per-frequency RoPE factors, from the tensors llama.cpp stores them in:

- llama (Llama 2/3.x, SmolLM, Mistral/Ministral, which llama.cpp converts as llama):
  Llama 3.x's `rope_freqs` (one divisor per rotary frequency pair, computed by the converter
  from the llama3 rope_scaling) becomes `"rope_scaling": {"rope_type": "freq_factors",
  "factors": [...]}`: frequency i is `rope_theta ** (-2i / rotary_dim) / factors[i]`.
- qwen2, qwen3 (q/k RMSNorm, no qkv bias).
- gemma2, gemma3 (text): sliding-window layers interleaved with global ones, the layer pattern
  llama.cpp assumes when the file states none (Gemma 2: every 2nd layer global, Gemma 3: every
  6th), soft-capping, `query_pre_attn_scalar` as llama.cpp takes it (head_dim, or
  hidden/heads for the 27B shapes), Gemma 3's RoPE base per layer type.
- phi3 (Phi-3, Phi-3.5, Phi-4-mini): partial rotary dimensions, long-RoPE factors
  (`rope_factors_long` / `rope_factors_short`), the sliding window (0: none).

Undone in the tensors: llama's q/k row permutation (llama arch only: the others use NeoX
RoPE and are stored unpermuted) and Gemma's RMSNorm weights, stored as w + 1.
"""

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from store.errors import ModelFormatError


class Family(NamedTuple):
    hf_architecture: str  # config.json's architectures entry
    model_type: str
    hidden_act: str
    norm_weight_offset: float  # the converter stored every RMSNorm weight w as w + this
    permutes_qk_rows: bool  # the converter permuted q/k rows for interleaved RoPE


# general.architecture -> its family
FAMILIES = {
    "llama": Family("LlamaForCausalLM", "llama", "silu", 0.0, True),
    "qwen2": Family("Qwen2ForCausalLM", "qwen2", "silu", 0.0, False),
    "qwen3": Family("Qwen3ForCausalLM", "qwen3", "silu", 0.0, False),
    "gemma2": Family("Gemma2ForCausalLM", "gemma2", "gelu_pytorch_tanh", 1.0, False),
    "gemma3": Family("Gemma3ForCausalLM", "gemma3_text", "gelu_pytorch_tanh", 1.0, False),
    "phi3": Family("Phi3ForCausalLM", "phi3", "silu", 0.0, False),
}

# The global-layer period llama.cpp assumes when a file states no sliding_window_pattern.
_DEFAULT_SLIDING_WINDOW_PATTERN = {"gemma2": 2, "gemma3": 6}
_DEFAULT_GEMMA2_SLIDING_WINDOW = 4096  # llama.cpp's default for Gemma 2 files without the key
_DEFAULT_SWA_ROPE_THETA = 10000.0  # llama.cpp's (and HF Gemma 3's) local RoPE base
_GEMMA_27B_NUM_LAYERS = {"gemma2": 46, "gemma3": 62}  # the shapes that scale queries by hidden/heads


def check_supported(architecture: Any, gguf_path: Path) -> Family:
    if architecture not in FAMILIES:
        raise ModelFormatError(
            gguf_path,
            f"architecture {architecture!r} is not supported (supported: {', '.join(FAMILIES)})",
        )
    return FAMILIES[architecture]


def build_config(
    metadata: dict[str, Any], tensor_names: list[str], config_tensors: dict[str, np.ndarray], gguf_path: Path
) -> dict[str, Any]:
    """The HF config.json dict of the model `metadata` describes.

    config_tensors: the file's GGUF_CONFIG_TENSORS present, as float32 arrays.
    """
    architecture = metadata.get("general.architecture")
    family = check_supported(architecture, gguf_path)

    def arch_key(name: str, default: Any = ModelFormatError) -> Any:
        key = f"{architecture}.{name}"
        if key in metadata:
            return metadata[key]
        if default is ModelFormatError:
            raise ModelFormatError(gguf_path, f"metadata key {key} is missing")
        return default

    num_heads = arch_key("attention.head_count")
    hidden_size = arch_key("embedding_length")
    head_dim = arch_key("attention.key_length", hidden_size // num_heads)
    config = {
        "architectures": [family.hf_architecture],
        "model_type": family.model_type,
        "vocab_size": arch_key("vocab_size", len(metadata["tokenizer.ggml.tokens"])),
        "hidden_size": hidden_size,
        "intermediate_size": arch_key("feed_forward_length"),
        "num_hidden_layers": arch_key("block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": arch_key("attention.head_count_kv", num_heads),
        "head_dim": head_dim,
        "rms_norm_eps": float32_shortest(arch_key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float32_shortest(arch_key("rope.freq_base", 10000.0)),
        "max_position_embeddings": arch_key("context_length"),
        # llama.cpp writes no output.weight when the head shares the embedding matrix
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "hidden_act": family.hidden_act,
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": metadata.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }
    rope_scaling = _scaling_from_keys(arch_key, config["max_position_embeddings"])
    if "rope_freqs.weight" in config_tensors:
        rope_scaling = {"rope_type": "freq_factors", "factors": _float_list(config_tensors["rope_freqs.weight"])}
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling

    if architecture in ("qwen2", "qwen3"):
        config["use_sliding_window"] = False
        config["sliding_window"] = None
    elif architecture in ("gemma2", "gemma3"):
        _add_gemma_fields(config, architecture, arch_key)
    elif architecture == "phi3":
        _add_phi3_fields(config, arch_key, config_tensors, gguf_path)
    return config


def _scaling_from_keys(arch_key, max_position_embeddings: int) -> dict[str, Any] | None:
    """rope_scaling from `{arch}.rope.scaling.*` (linear, yarn), None without."""
    scaling_type = arch_key("rope.scaling.type", None)
    if scaling_type in (None, "none"):
        return None
    scaling = {
        "rope_type": scaling_type,
        "factor": float32_shortest(arch_key("rope.scaling.factor")),
    }
    if scaling_type != "linear":
        scaling["original_max_position_embeddings"] = arch_key(
            "rope.scaling.original_context_length", max_position_embeddings)
    return scaling


def _add_gemma_fields(config: dict[str, Any], architecture: str, arch_key) -> None:
    num_layers = config["num_hidden_layers"]
    config["hidden_activation"] = config["hidden_act"]
    is_27b_shape = num_layers == _GEMMA_27B_NUM_LAYERS[architecture]
    config["query_pre_attn_scalar"] = (
        config["hidden_size"] // config["num_attention_heads"] if is_27b_shape else config["head_dim"])
    config["final_logit_softcapping"] = _optional_float(arch_key("final_logit_softcapping", None))
    config["attn_logit_softcapping"] = _optional_float(arch_key("attn_logit_softcapping", None))
    default_window = _DEFAULT_GEMMA2_SLIDING_WINDOW if architecture == "gemma2" else 0
    sliding_window = arch_key("attention.sliding_window", default_window)
    if not sliding_window:
        is_sliding = [False] * num_layers
    else:
        is_sliding = sliding_layers(arch_key("attention.sliding_window_pattern",
                                             _DEFAULT_SLIDING_WINDOW_PATTERN[architecture]), num_layers)
    config["sliding_window"] = sliding_window or None
    config["layer_types"] = ["sliding_attention" if sliding else "full_attention" for sliding in is_sliding]
    if architecture == "gemma3":
        config["rope_local_base_freq"] = float32_shortest(arch_key("rope.freq_base_swa", _DEFAULT_SWA_ROPE_THETA))
        period = arch_key("attention.sliding_window_pattern", _DEFAULT_SLIDING_WINDOW_PATTERN[architecture])
        if isinstance(period, int):
            config["sliding_window_pattern"] = period


def sliding_layers(pattern: int | list[bool], num_layers: int) -> list[bool]:
    """Which layers use the sliding window, as llama.cpp reads `sliding_window_pattern`: a
    list of flags per layer, or a period n whose every n-th layer (the last of each n) is global."""
    if isinstance(pattern, list):
        return [bool(flag) for flag in pattern[:num_layers]]
    return [pattern == 0 or layer % pattern < pattern - 1 for layer in range(num_layers)]


def _add_phi3_fields(config: dict[str, Any], arch_key, config_tensors: dict[str, np.ndarray],
                     gguf_path: Path) -> None:
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    config["head_dim"] = head_dim
    rotary_dim = arch_key("rope.dimension_count", head_dim)
    config["partial_rotary_factor"] = rotary_dim / head_dim
    config["original_max_position_embeddings"] = arch_key(
        "rope.scaling.original_context_length", config["max_position_embeddings"])
    config["sliding_window"] = arch_key("attention.sliding_window", 0) or None  # 0: Phi-4, no window
    long, short = config_tensors.get("rope_factors_long.weight"), config_tensors.get("rope_factors_short.weight")
    if (long is None) != (short is None):
        raise ModelFormatError(gguf_path, "long-RoPE needs both rope_factors_long and rope_factors_short")
    if long is not None:
        if len(long) != rotary_dim // 2 or len(short) != rotary_dim // 2:
            raise ModelFormatError(gguf_path, f"long-RoPE factors have {len(long)} and {len(short)} entries, "
                                              f"the rotary dimensions need {rotary_dim // 2}")
        config["rope_scaling"] = {"type": "longrope", "rope_type": "longrope",
                                  "long_factor": _float_list(long), "short_factor": _float_list(short)}


def undo_converter_changes(array: np.ndarray, hf_name: str, config: dict[str, Any]) -> np.ndarray:
    """A float32 tensor as the HF checkpoint held it, from its GGUF form (HF layout)."""
    family = FAMILIES[architecture_of(config)]
    if family.permutes_qk_rows:
        # llama.cpp permutes q/k rows for its interleaved rope; HF rotates halves
        if ".self_attn.q_proj." in hf_name:
            return unpermute_rope_rows(array, config["num_attention_heads"])
        if ".self_attn.k_proj." in hf_name:
            return unpermute_rope_rows(array, config["num_key_value_heads"])
    if family.norm_weight_offset and hf_name.endswith("norm.weight"):
        return array - np.float32(family.norm_weight_offset)
    return array


def permutes_qk_rows(config: dict[str, Any]) -> bool:
    return FAMILIES[architecture_of(config)].permutes_qk_rows


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's `permute`: per head, rows (pair, 2) -> (2, pair).

    weight: (num_heads * head_dim, ...) or a bias (num_heads * head_dim,).
    """
    head_dim = weight.shape[0] // num_heads
    rows = weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])
    return rows.swapaxes(1, 2).reshape(weight.shape)


def architecture_of(config: dict[str, Any]) -> str:
    hf_architecture = config["architectures"][0]
    return next(arch for arch, family in FAMILIES.items() if family.hf_architecture == hf_architecture)


def float32_shortest(value: float) -> float:
    """The shortest decimal with the same float32 value: GGUF stores 1e-5 as 9.99999974e-06."""
    return float(str(np.float32(value)))


def _optional_float(value: float | None) -> float | None:
    return None if value is None else float32_shortest(value)


def _float_list(values: np.ndarray) -> list[float]:
    return [float32_shortest(v) for v in np.asarray(values, dtype=np.float32).reshape(-1)]

"""Tiny random models of every supported family, made with transformers: the reference for the
family tests (tests/model/test_families.py). Weights are scaled up from transformers' init (and
norms, biases and Gemma's (1 + w) norms perturbed) so that logits are far from flat."""

import json
from pathlib import Path

import torch
import transformers

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)
WINDOW = 8  # the sliding window of the windowed families: every test prompt is longer
FREQ_FACTORS = [1.0, 1.0, 1.5, 2.0, 4.0, 8.0, 8.0, 8.0]  # one per frequency of a 16-wide head
PHI3_ORIGINAL_CONTEXT = 48  # longrope: short factors up to it, long factors past it


def _phi3_rope(head_dim: int, partial: float) -> dict:
    half = int(head_dim * partial) // 2
    return dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=partial,
                short_factor=[1.0 + 0.1 * i for i in range(half)], long_factor=[1.0 + 0.7 * i for i in range(half)],
                original_max_position_embeddings=PHI3_ORIGINAL_CONTEXT)


# name -> (config class, model class, config overrides)
FAMILIES = {
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=16))),
    # transformers has no freq_factors: its reference gets the divided frequencies put in (make_tiny)
    "llama3-freq-factors": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True, rope_theta=500000.0)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=False)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=24, tie_word_embeddings=True)),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24, attn_logit_softcapping=4.0,
        final_logit_softcapping=6.0, hidden_activation="gelu_pytorch_tanh")),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": dict(rope_type="linear", factor=4.0, rope_theta=1000000.0),
                         "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        rope_parameters=_phi3_rope(16, 0.5), original_max_position_embeddings=PHI3_ORIGINAL_CONTEXT, pad_token_id=0,
        tie_word_embeddings=False)),
}
WINDOWED = ("mistral-window", "gemma2", "gemma3")


def make_tiny(name: str, path: Path):
    """Save a tiny random `name` model to `path`; returns the transformers model (eval, float32)."""
    config_name, model_name, extra = FAMILIES[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**TINY, **extra)
    config._attn_implementation = "eager"  # Gemma 2's soft cap runs only there
    if name == "phi3":  # transformers takes the top-level value over rope_parameters'
        assert config.rope_parameters["original_max_position_embeddings"] == PHI3_ORIGINAL_CONTEXT
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name or param_name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
            else:
                param.mul_(4.0)  # transformers' 0.02 init leaves logits nearly flat
    model.save_pretrained(path)
    if name == "llama3-freq-factors":
        raw = json.loads((path / "config.json").read_text())
        raw.pop("rope_parameters", None)
        raw["rope_theta"] = 500000.0
        raw["rope_scaling"] = {"rope_type": "freq_factors", "factors": FREQ_FACTORS}  # the GGUF importer's contract
        (path / "config.json").write_text(json.dumps(raw))
        rotary = model.model.rotary_emb
        rotary.inv_freq = rotary.inv_freq / torch.tensor(FREQ_FACTORS)
        rotary.original_inv_freq = rotary.inv_freq
    return model


def reference_logits(model, token_ids: list[int]) -> torch.Tensor:
    """(T, V) float32 logits of one full forward pass."""
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()

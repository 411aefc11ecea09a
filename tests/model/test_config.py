"""ModelConfig from config.json: the facts each family's config states, in transformers 4.x's dialect
(what checkpoints on the Hub carry; tests/model/test_families.py covers what transformers 5 writes)."""

import json

import pytest

from model.config import ModelConfig
from store.errors import ModelFormatError

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096)


def test_gemma3_text_in_the_4x_dialect():
    config = ModelConfig.from_dict({**BASE, "architectures": ["Gemma3ForCausalLM"], "head_dim": 32,
                                    "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                                    "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 512,
                                    "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
                                    "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None})
    assert config.layer_windows == (512, 512, 512, 512, 512, None)
    assert (config.rope_theta, config.rope_scaling) == (1000000.0, {"rope_type": "linear", "factor": 8.0})
    assert (config.sliding_rope_theta, config.sliding_rope_scaling) == (10000.0, None)
    assert config.uses_sliding_rope(0) and not config.uses_sliding_rope(5)
    assert config.has_qk_norm and config.norm_adds_one and config.has_sandwich_norms and config.tie_word_embeddings
    assert config.hidden_act == "gelu_tanh" and config.attention_scale == 256**-0.5
    assert config.embedding_multiplier == 8.0 and config.final_logit_softcap is None


def test_gemma2_alternates_and_caps():
    config = ModelConfig.from_dict({**BASE, "architectures": ["Gemma2ForCausalLM"], "sliding_window": 1024,
                                    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                                    "hidden_activation": "gelu_pytorch_tanh"})
    assert config.layer_windows == (1024, None) * 3
    assert (config.attn_logit_softcap, config.final_logit_softcap) == (50.0, 30.0)
    assert config.sliding_rope_theta is None and not config.has_qk_norm


def test_phi3_su_rope_with_the_original_context_at_the_top():
    factors = [1.0] * 9  # one per frequency of the 18 rotary dimensions
    config = ModelConfig.from_dict({**BASE, "architectures": ["Phi3ForCausalLM"], "hidden_size": 96,
                                    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                                    "partial_rotary_factor": 0.75, "sliding_window": 2047,
                                    "rope_scaling": {"type": "su", "short_factor": factors, "long_factor": factors}})
    assert config.rotary_dim == 18 and config.head_dim == 24
    assert config.rope_scaling["original_max_position_embeddings"] == 4096
    assert config.rope_scaling["factor"] == 32.0
    assert config.layer_windows == (2047,) * 6


def test_a_window_no_sequence_can_exceed_is_no_window():
    phi4_mini = {**BASE, "architectures": ["Phi3ForCausalLM"], "max_position_embeddings": 131072,
                 "sliding_window": 262144}
    assert ModelConfig.from_dict(phi4_mini).layer_windows == ()


def test_qwen_windows_only_when_asked():
    qwen = {**BASE, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 1024, "max_window_layers": 4}
    assert ModelConfig.from_dict({**qwen, "use_sliding_window": False}).layer_windows == ()
    assert ModelConfig.from_dict({**qwen, "use_sliding_window": True}).layer_windows == (None,) * 4 + (1024,) * 2
    assert ModelConfig.from_dict({**qwen, "architectures": ["Qwen3ForCausalLM"]}).has_qk_norm


def test_llama3_freq_factors_pass_through():
    scaling = {"rope_type": "freq_factors", "factors": [1.0] * 8}
    config = ModelConfig.from_dict({**BASE, "architectures": ["LlamaForCausalLM"], "rope_theta": 500000.0,
                                    "rope_scaling": scaling, "sliding_window": 16})
    assert config.rope_scaling == scaling and config.layer_windows == ()  # Llama has no windows


def test_an_unsupported_family_is_refused_with_the_file_and_the_list(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "architectures": ["GPTNeoXForCausalLM"]}))
    with pytest.raises(ModelFormatError) as error:
        ModelConfig.from_model_dir(tmp_path)
    message = str(error.value)
    assert "config.json" in message and "GPTNeoXForCausalLM" in message
    assert "Gemma3ForCausalLM" in message and "Phi3ForCausalLM" in message and "Qwen3ForCausalLM" in message


@pytest.mark.parametrize("rope_scaling, what", [({"rope_type": "yarn", "factor": 4.0}, "yarn"),
                                                ({"rope_type": "freq_factors", "factors": [1.0, 2.0]}, "8 numbers")])
def test_a_rope_the_model_cannot_run_is_refused_with_the_file(tmp_path, rope_scaling, what):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "architectures": ["LlamaForCausalLM"],
                                                      "rope_scaling": rope_scaling}))
    with pytest.raises(ModelFormatError, match=what) as error:
        ModelConfig.from_model_dir(tmp_path)
    assert "config.json" in str(error.value)

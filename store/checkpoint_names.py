"""The checkpoint-name map, stated once: GGUF names -> HF names -> the model's fused modules.

The model (model/decoder.py) fuses q|k|v and gate|up into one projection each; HF checkpoints
keep them apart (Phi-3's keep them fused too), and GGUF files name them their own way. Which
HF tensors fill a module depends on the family's layout (`layer_modules`): Gemma 2/3 name
their four norms their own way, Qwen3 and Gemma 3 add q/k norms. The GGUF converter
(store/gguf_import.py), the safetensors loader and the GGUF block loader (model/weights.py)
all read this map.
"""

# GGUF per-layer tensor stem -> HF module under model.layers.N (llama, qwen2, qwen3, phi3).
GGUF_LAYER_MODULES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Where a family's GGUF stems mean other HF modules than the common map says.
GGUF_LAYER_MODULES_BY_ARCHITECTURE: dict[str, dict[str, str]] = {
    # Gemma 2/3 norm around both sublayers: GGUF's "ffn_norm" is HF's pre-feedforward norm and
    # HF's post_attention_layernorm is GGUF's "post_attention_norm"
    "gemma2": {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    "gemma3": {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    # Phi-3 keeps q|k|v and gate|up fused, in HF as in GGUF ("ffn_up" is gate|up, gate first)
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
# GGUF top-level tensor stem -> HF module.
GGUF_TOP_MODULES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# GGUF tensors that are config, not weights: they go into config.json's rope scaling
# (store/gguf_families.py), never into the safetensors.
GGUF_CONFIG_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")

# The model's per-layer module -> the HF modules (under model.layers.N.) its weight concatenates
# row-wise, in order, each with the ModelConfig size of its rows (None: the whole tensor).
FUSED_LAYER_MODULES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "self_attn.qkv_proj": (("self_attn.q_proj", "q_size"), ("self_attn.k_proj", "kv_size"),
                           ("self_attn.v_proj", "kv_size")),
    "self_attn.o_proj": (("self_attn.o_proj", None),),
    "mlp.gate_up_proj": (("mlp.gate_proj", "intermediate_size"), ("mlp.up_proj", "intermediate_size")),
    "mlp.down_proj": (("mlp.down_proj", None),),
    "input_layernorm": (("input_layernorm", None),),
    "post_attention_layernorm": (("post_attention_layernorm", None),),
}
# Phi-3/4 checkpoints hold q|k|v and gate|up already fused, in the model's order.
PHI3_LAYER_MODULES = {
    **FUSED_LAYER_MODULES,
    "self_attn.qkv_proj": (("self_attn.qkv_proj", None),),
    "mlp.gate_up_proj": (("mlp.gate_up_proj", None),),
}
# Gemma 2/3: the model's post_attention_layernorm is the MLP's input norm (HF: pre_feedforward_layernorm);
# HF's post_attention_layernorm and post_feedforward_layernorm norm the two sublayers' outputs.
GEMMA_LAYER_MODULES = {
    **FUSED_LAYER_MODULES,
    "post_attention_layernorm": (("pre_feedforward_layernorm", None),),
    "attn_output_norm": (("post_attention_layernorm", None),),
    "mlp_output_norm": (("post_feedforward_layernorm", None),),
}
# Per-head q/k norms (Qwen3, Gemma 3).
QK_NORM_MODULES = {
    "self_attn.q_norm": (("self_attn.q_norm", None),),
    "self_attn.k_norm": (("self_attn.k_norm", None),),
}


def layer_modules(family: str, has_qk_norm: bool) -> dict[str, tuple[tuple[str, str | None], ...]]:
    """The per-layer map (model module -> its HF parts) of a family (model.config's family names)."""
    modules = {"phi3": PHI3_LAYER_MODULES, "gemma2": GEMMA_LAYER_MODULES,
               "gemma3": GEMMA_LAYER_MODULES}.get(family, FUSED_LAYER_MODULES)
    return {**modules, **QK_NORM_MODULES} if has_qk_norm else dict(modules)


# The model's top-level module -> its HF module. A tied lm_head is the embedding table.
TOP_MODULES = {"embed_tokens": "model.embed_tokens", "norm": "model.norm", "lm_head": "lm_head"}
TIED_LM_HEAD = "model.embed_tokens"

# The projections (the modules a backend may run its own linear layer for).
PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def hf_tensor_name(gguf_name: str, architecture: str = "llama") -> str | None:
    """"blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; None for a name outside
    the map of `architecture` (GGUF's general.architecture)."""
    stem, _, suffix = gguf_name.rpartition(".")  # suffix: weight / bias
    parts = stem.split(".")
    if len(parts) == 1 and stem in GGUF_TOP_MODULES:
        return f"{GGUF_TOP_MODULES[stem]}.{suffix}"
    layer_modules = {**GGUF_LAYER_MODULES, **GGUF_LAYER_MODULES_BY_ARCHITECTURE.get(architecture, {})}
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_modules:
        return f"model.layers.{parts[1]}.{layer_modules[parts[2]]}.{suffix}"
    return None


def hf_parts(module_name: str, tie_word_embeddings: bool,
             layer_map: dict[str, tuple[tuple[str, str | None], ...]] = FUSED_LAYER_MODULES,
             ) -> tuple[tuple[str, str | None], ...]:
    """The model's module ("layers.3.mlp.gate_up_proj", "lm_head") -> its (HF module, row size) parts;
    `layer_map`: the family's per-layer map (layer_modules)."""
    if module_name == "lm_head" and tie_word_embeddings:
        return ((TIED_LM_HEAD, None),)
    if module_name in TOP_MODULES:
        return ((TOP_MODULES[module_name], None),)
    _, index, local = module_name.split(".", 2)
    return tuple((f"model.layers.{index}.{hf}", size) for hf, size in layer_map[local])

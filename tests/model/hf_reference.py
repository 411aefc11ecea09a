"""The reference for our model on a converted GGUF directory: transformers' own model over the
file's weights as `gguf` dequantizes them. A converted directory keeps its quantized matrices only
as blocks (gguf_blocks.safetensors), so transformers cannot load it as it stands."""

from pathlib import Path

import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from safetensors import safe_open

from store.block_file import read_block_file


def dequantized_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    """model.safetensors' tensors and the block file's, dequantized by gguf (no tensor is in both)."""
    with safe_open(str(Path(model_dir) / "model.safetensors"), "pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    for name, blocks in read_block_file(model_dir).items():
        assert name not in tensors, f"{name} is both float32 and blocks"
        values = dequantize(blocks.rows, GGMLQuantizationType[blocks.format]).astype(np.float32)
        tensors[name] = torch.from_numpy(values.reshape(blocks.rows.shape[0], blocks.cols))
    return tensors


def hf_reference_model(model_dir: Path) -> transformers.PreTrainedModel:
    """transformers' causal LM of the directory's config.json, float32, with the dequantized weights."""
    config = transformers.AutoConfig.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(dequantized_state_dict(model_dir), strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= ({"lm_head.weight"} if config.tie_word_embeddings else set()), missing
    model.tie_weights()
    return model.eval()

"""Loading HF safetensors weights into `LlamaForCausalLM`.

HF keeps q/k/v and gate/up as separate tensors; the model fuses them, so each
fused parameter is filled slice by slice. Every tensor is checked for presence
and shape, and every failure names the file and the tensor.
"""

import json
import logging
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from store.block_file import fused, read_block_weights
from store.errors import ModelFormatError
from store.gguf_import import BLOCKS_FILE
from model.config import ModelConfig
from model.llama import LlamaForCausalLM
from store.model_store import radixserve_home
from kernels import cpu_decode_ops, cpu_matvec, packed_linear
from kernels.cpu_matvec import BlockWeight

logger = logging.getLogger("radixserve.engine")


def safetensors_files(model_dir: Path) -> list[Path]:
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as error:
            raise ModelFormatError(index_path, f"unreadable index: {error}") from None
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(path for path in model_dir.glob("*.safetensors") if path.name != BLOCKS_FILE)
    if not files:
        raise ModelFormatError(model_dir, "no *.safetensors weights in the model directory")
    return files


def _parameter_slices(model: LlamaForCausalLM) -> dict[str, tuple[torch.Tensor, int, int]]:
    """HF tensor name -> (our parameter, first row, end row) it fills."""
    config = model.config
    q, kv, inter = config.q_size, config.kv_size, config.intermediate_size
    slices: dict[str, tuple[torch.Tensor, int, int]] = {}

    def whole(name: str, param: torch.Tensor) -> None:
        slices[name] = (param, 0, param.shape[0])

    whole("model.embed_tokens.weight", model.embed_tokens.weight)
    whole("model.norm.weight", model.norm.weight)
    if not config.tie_word_embeddings:
        whole("lm_head.weight", model.lm_head.weight)
    for i, layer in enumerate(model.layers):
        prefix = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        for part, start, end in (("q", 0, q), ("k", q, q + kv), ("v", q + kv, q + 2 * kv)):
            slices[f"{prefix}self_attn.{part}_proj.weight"] = (attn.qkv_proj.weight, start, end)
            if config.has_qkv_bias:
                slices[f"{prefix}self_attn.{part}_proj.bias"] = (attn.qkv_proj.bias, start, end)
        whole(f"{prefix}self_attn.o_proj.weight", attn.o_proj.weight)
        slices[f"{prefix}mlp.gate_proj.weight"] = (mlp.gate_up_proj.weight, 0, inter)
        slices[f"{prefix}mlp.up_proj.weight"] = (mlp.gate_up_proj.weight, inter, 2 * inter)
        whole(f"{prefix}mlp.down_proj.weight", mlp.down_proj.weight)
        whole(f"{prefix}input_layernorm.weight", layer.input_layernorm.weight)
        whole(f"{prefix}post_attention_layernorm.weight", layer.post_attention_layernorm.weight)
    return slices


# Tensors some checkpoints carry that the model has no use for.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_weights(model: LlamaForCausalLM, model_dir: Path) -> None:
    """Fill every parameter of `model` from the safetensors files of `model_dir`."""
    slices = _parameter_slices(model)
    loaded: set[str] = set()
    for path in safetensors_files(model_dir):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as file:
                for name in file.keys():
                    if name not in slices:
                        if name == "lm_head.weight" and model.config.tie_word_embeddings:
                            continue
                        if name.endswith(_IGNORED_SUFFIXES):
                            continue
                        raise ModelFormatError(path, f"unexpected tensor {name!r} for this architecture")
                    param, start, end = slices[name]
                    tensor = file.get_tensor(name)
                    expected = (end - start, *param.shape[1:])
                    if tuple(tensor.shape) != expected:
                        raise ModelFormatError(
                            path,
                            f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {expected}",
                        )
                    param.data[start:end].copy_(tensor)
                    loaded.add(name)
        except SafetensorError as error:
            raise ModelFormatError(path, f"corrupt safetensors file ({error})") from None
        except OSError as error:
            raise ModelFormatError(path, f"unreadable ({error.strerror or error})") from None
    missing = sorted(set(slices) - loaded)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelFormatError(model_dir, f"missing tensors {missing[:3]}{more}")


def load_model(
    model_dir: Path, device: torch.device, dtype: torch.dtype, pack_weights: bool = True, gguf_blocks: bool = True
) -> LlamaForCausalLM:
    """The model with its weights. On CPU in float32, unless `pack_weights` is
    False (the plain path): projections move to oneDNN's prepacked layout, and
    few-row products (decode) go through the AVX2 kernels of
    kernels/cpu_matvec.py, built once under $RADIXSERVE_HOME/kernels. Those read
    the GGUF blocks a converted model keeps (unless `gguf_blocks` is False),
    else a kept row-major copy of each float32 weight (twice the weight memory,
    for ~20% faster batch-1 decode). Norms, RoPE + KV store, decode attention
    and SwiGLU run as fused C kernels (kernels/cpu_decode_ops.py)."""
    config = ModelConfig.from_model_dir(model_dir)
    model = LlamaForCausalLM(config, device, dtype)
    load_weights(model, Path(model_dir))
    if pack_weights and packed_linear.is_available(device, dtype):
        build_dir = radixserve_home() / "kernels"
        kernels = cpu_matvec.load(build_dir)
        blocks = module_blocks(model, read_block_weights(Path(model_dir))) if kernels and gguf_blocks else {}
        ops = cpu_decode_ops.load(build_dir)
        model.pack_weights(kernels, blocks, ops)
        if blocks:
            formats = "/".join(sorted({weight.format for weight in blocks.values()}))
            weights = f"GGUF blocks ({formats}) for {len(blocks)} of {4 * config.num_layers + 1} weights"
        else:
            weights = "float32 weights" + (" (row-major copies)" if kernels else " (oneDNN)")
        logger.info("CPU float32: decode reads %s; small ops run as %s", weights,
                    "fused C kernels" if ops else "torch ops")
    return model.eval()


def module_blocks(model: LlamaForCausalLM, weights: dict[str, BlockWeight]) -> dict[str, BlockWeight]:
    """Module name -> the GGUF blocks of its (fused) weight, for the modules whose
    every part has blocks of one format; the rest stay float32."""
    by_module: dict[str, BlockWeight | None] = {}
    for i in range(model.config.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        by_module[ours + "self_attn.qkv_proj"] = fused(weights, [hf + f"self_attn.{p}_proj.weight" for p in "qkv"])
        by_module[ours + "self_attn.o_proj"] = fused(weights, [hf + "self_attn.o_proj.weight"])
        by_module[ours + "mlp.gate_up_proj"] = fused(weights, [hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"])
        by_module[ours + "mlp.down_proj"] = fused(weights, [hf + "mlp.down_proj.weight"])
    head = "model.embed_tokens.weight" if model.config.tie_word_embeddings else "lm_head.weight"
    by_module["lm_head"] = fused(weights, [head])
    return {name: blocks for name, blocks in by_module.items() if blocks is not None}

"""Loading a model: its config, the backend that runs it, and its weights.

HF keeps q/k/v and gate/up as separate tensors; the model fuses them, so each
fused parameter is filled slice by slice, as the checkpoint-name map says
(store/checkpoint_names.py). Every tensor is checked for presence and shape,
and every failure names the file and the tensor.
"""

import json
import logging
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from kernels.cpu_matvec import BlockWeight
from model.backends import Backend, select_backend
from model.config import ModelConfig
from model.decoder import DecoderForCausalLM, RMSNorm
from store.block_file import BLOCKS_FILE, GGUFBlocks, read_block_file
from store.checkpoint_names import PROJECTIONS, TOP_MODULES, hf_parts, layer_modules
from store.errors import ModelFormatError
from store.model_store import radixserve_home

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


def _parameter_slices(model: DecoderForCausalLM) -> dict[str, tuple[torch.Tensor, int, int]]:
    """HF tensor name -> (our parameter, first row, end row) it fills."""
    config = model.config
    layer_map = layer_modules(config.family, config.has_qk_norm)
    modules = list(TOP_MODULES) + [f"layers.{i}.{local}" for i in range(config.num_layers) for local in layer_map]
    if config.tie_word_embeddings:
        modules.remove("lm_head")  # the embedding table, filled once
    slices: dict[str, tuple[torch.Tensor, int, int]] = {}
    for name in modules:
        module = model.get_submodule(name)
        for suffix in ("weight", "bias"):
            param = getattr(module, suffix, None)
            if param is None:
                continue
            start = 0
            for hf_module, size_field in hf_parts(name, config.tie_word_embeddings, layer_map):
                rows = param.shape[0] if size_field is None else getattr(config, size_field)
                slices[f"{hf_module}.{suffix}"] = (param, start, start + rows)
                start += rows
    return slices


# Tensors some checkpoints carry that the model has no use for.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_weights(model: DecoderForCausalLM, model_dir: Path) -> None:
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
    if model.config.norm_adds_one:  # Gemma's norms scale by (1 + w): fold the 1 into the weight once
        for name, module in model.named_modules():
            if isinstance(module, RMSNorm):
                module.weight.data += 1.0


def load_model(
    model_dir: Path, device: torch.device, dtype: torch.dtype, backend: str | Backend = "auto", gguf_blocks: bool = True,
    max_model_len: int | None = None,
) -> DecoderForCausalLM:
    """The model with its weights, run by `backend` (a name for select_backend, or one
    already made). A backend that reads GGUF blocks (cpu) gets those of a converted model
    unless `gguf_blocks` is False. `max_model_len`: the longest sequence served (default: the
    model's); longrope models take their long factors when it exceeds their original context,
    once for every position (llama.cpp's choice), so that cached K and new K rotate alike.
    Logs what runs (Backend.describe)."""
    model_dir = Path(model_dir)
    config = ModelConfig.from_model_dir(model_dir)
    if isinstance(backend, str):
        backend = select_backend(device, dtype, config, backend, build_dir=radixserve_home() / "kernels")
    model = DecoderForCausalLM(config, device, dtype, backend, long_context=uses_long_rope(config, max_model_len))
    load_weights(model, model_dir)
    blocks = module_blocks(config, read_block_file(model_dir)) if gguf_blocks and backend.reads_blocks else {}
    backend.prepare(model, blocks)
    logger.info("%s", backend.describe())
    return model.eval()


def uses_long_rope(config: ModelConfig, max_model_len: int | None) -> bool:
    """Whether a longrope model serving up to `max_model_len` tokens takes its long factors."""
    scaling = config.rope_scaling or {}
    original = scaling.get("original_max_position_embeddings")
    if scaling.get("rope_type", scaling.get("type")) not in ("longrope", "su") or original is None:
        return False
    return min(max_model_len or config.max_position_embeddings, config.max_position_embeddings) > original


def module_blocks(config: ModelConfig, weights: dict[str, GGUFBlocks]) -> dict[str, BlockWeight]:
    """Module name -> the GGUF blocks of its (fused) weight, in the kernels' layout, for the
    projections (and the LM head) whose every part has blocks of one format; the rest
    stay float32."""
    names = [f"layers.{i}.{local}" for i in range(config.num_layers) for local in PROJECTIONS] + ["lm_head"]
    layer_map = layer_modules(config.family, config.has_qk_norm)
    by_module = {}
    for name in names:
        parts = [weights.get(f"{hf_module}.weight")
                 for hf_module, _ in hf_parts(name, config.tie_word_embeddings, layer_map)]
        if any(part is None for part in parts) or len({part.format for part in parts}) != 1:
            continue
        kernel_parts = [BlockWeight.from_gguf(part.format, part.rows, part.cols) for part in parts]
        by_module[name] = kernel_parts[0] if len(parts) == 1 else BlockWeight.concat(kernel_parts)
    return by_module

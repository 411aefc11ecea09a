"""Loading a model: its config, the backend that runs it, and its weights.

HF keeps q/k/v and gate/up as separate tensors; the model fuses them, so each
fused parameter is filled slice by slice, as the checkpoint-name map says
(store/checkpoint_names.py). Every tensor is checked for presence and shape,
and every failure names the file and the tensor.
"""

import json
import logging
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from kernels.block_formats import KERNEL_GROUP, BlockWeight, block_format, dequantize_reference
from model.backends import Backend, select_backend
from model.config import ModelConfig
from model.decoder import DecoderForCausalLM, RMSNorm
from store.block_file import BLOCKS_FILE, BlockEntry, block_entries, block_file_formats, iter_block_file, read_blocks_into
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


def check_weight_files(model_dir: Path) -> None:
    """Opens every safetensors file of `model_dir` (its header only: the tensors are mapped, not read) and raises
    the ModelFormatError load_weights would: a truncated or corrupt file fails before the backend is made (which
    can compile its kernels first: ~15 s on a fresh machine), not after."""
    for path in safetensors_files(Path(model_dir)):
        with _reading(path):
            with safe_open(str(path), framework="pt", device="cpu") as file:
                file.keys()


@contextmanager
def _reading(path: Path):
    """Reading one safetensors file: its errors become ModelFormatErrors naming it."""
    try:
        yield
    except SafetensorError as error:
        raise ModelFormatError(path, f"corrupt safetensors file ({error})") from None
    except OSError as error:
        raise ModelFormatError(path, f"unreadable ({error.strerror or error})") from None


def load_weights(model: DecoderForCausalLM, model_dir: Path, held_as_blocks: frozenset[str] = frozenset()) -> None:
    """Fill every parameter of `model` from the safetensors files of `model_dir`, except the
    tensors in `held_as_blocks` (HF names in the model's block file, filled by the caller)."""
    slices = _parameter_slices(model)
    loaded: set[str] = set()
    for path in safetensors_files(model_dir):
        with _reading(path):
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
    missing = sorted(set(slices) - loaded - held_as_blocks)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelFormatError(model_dir, f"missing tensors {missing[:3]}{more}")
    if model.config.norm_adds_one:  # Gemma's norms scale by (1 + w): fold the 1 into the weight once
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.data += 1.0


def load_model(
    model_dir: Path, device: torch.device, dtype: torch.dtype, backend: str | Backend = "auto", gguf_blocks: bool = True,
    max_model_len: int | None = None,
) -> DecoderForCausalLM:
    """The model with its weights, run by `backend` (a name for select_backend, or one
    already made). The weights a converted GGUF keeps as blocks (store/block_file.py) stay
    blocks for a backend that reads them (cpu), with no float32 copy; for any other backend,
    or with `gguf_blocks` False, they are dequantized at load (and describe() says so).
    `max_model_len`: the longest sequence served (default: the model's); longrope models take
    their long factors when it exceeds their original context, once for every position
    (llama.cpp's choice), so that cached K and new K rotate alike.
    Logs what runs (Backend.describe)."""
    model_dir = Path(model_dir)
    config = ModelConfig.from_model_dir(model_dir)
    if isinstance(backend, str):
        check_weight_files(model_dir)  # before select_backend compiles kernels (LLMEngine checks before it makes one)
        backend = select_backend(device, dtype, config, backend, build_dir=radixserve_home() / "kernels")
    # Parameters are allocated but not written (to_empty): the pages of those left to blocks are
    # never touched, so they never become resident, and they are dropped when prepare swaps the modules.
    model = DecoderForCausalLM(config, device, dtype, backend, long_context=uses_long_rope(config, max_model_len))
    block_formats = block_file_formats(model_dir)
    load_weights(model, model_dir, frozenset(block_formats))
    blocks: dict[str, list[BlockWeight]] = {}
    if block_formats and gguf_blocks and backend.reads_blocks:
        blocks = module_blocks(model, model_dir)
    elif block_formats:
        dequantize_blocks_into(model, model_dir)
        why = "the backend reads no blocks" if gguf_blocks else "gguf_blocks off"
        backend.weight_notes += (f"weights {', '.join(sorted(set(block_formats.values())))} "
                                 f"dequantized to {str(dtype).removeprefix('torch.')} at load ({why})",)
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


def dequantize_blocks_into(model: DecoderForCausalLM, model_dir: Path) -> None:
    """Fill the parameters the block file holds with its dequantized values (gguf's dequantize),
    one tensor at a time."""
    slices = _parameter_slices(model)
    for name, gguf_blocks in iter_block_file(model_dir / BLOCKS_FILE):
        if name not in slices:
            if name == "lm_head.weight" and model.config.tie_word_embeddings:
                continue
            raise ModelFormatError(model_dir / BLOCKS_FILE, f"unexpected tensor {name!r} for this architecture")
        param, start, end = slices[name]
        weight = BlockWeight.from_gguf(gguf_blocks.format, gguf_blocks.rows, gguf_blocks.cols)
        if (weight.rows, weight.cols) != (end - start, *param.shape[1:]):
            raise ModelFormatError(model_dir / BLOCKS_FILE, f"tensor {name!r} has shape ({weight.rows}, "
                                   f"{weight.cols}), expected {(end - start, *param.shape[1:])}")
        param.data[start:end].copy_(dequantize_reference(weight))


# The modules whose weights may stay blocks: the embedding table, the LM head and the projections.
def _block_module_names(config: ModelConfig) -> list[str]:
    return (["embed_tokens", "lm_head"]
            + [f"layers.{i}.{local}" for i in range(config.num_layers) for local in PROJECTIONS])


def module_blocks(model: DecoderForCausalLM, model_dir: Path) -> dict[str, list[BlockWeight]]:
    """Module name -> its weight as blocks, in row order: one BlockWeight per run of parts of
    one format (a fused q|k|v whose v is Q6_K and q, k Q4_K is two). A part the block file
    lacks (a float32 tensor) joins as F32 blocks of its loaded values. A module none of whose
    parts are blocks, or whose width is no whole number of kernel groups, stays as loaded
    (its blocks, if any, dequantized into it). The tied LM head shares the embedding's blocks.
    Each part is read from the file straight into its rows of the fused weight (only a format
    whose scales are widened goes through a copy), so the load's peak is the model's blocks:
    transient copies, freed, stayed in the allocator's heap (86 MiB of a 1B Q8_0 model)."""
    config = model.config
    path = model_dir / BLOCKS_FILE
    entries = block_entries(path)
    layer_map = layer_modules(config.family, config.has_qk_norm)
    by_module: dict[str, list[BlockWeight]] = {}
    with open(path, "rb") as file:
        for name in _block_module_names(config):
            hf_parts_ = hf_parts(name, config.tie_word_embeddings, layer_map) if name != "embed_tokens" else (
                (TOP_MODULES["embed_tokens"], None),)
            hf_names = [f"{hf_module}.weight" for hf_module, _ in hf_parts_]
            if name == "lm_head" and config.tie_word_embeddings and "embed_tokens" in by_module:
                by_module[name] = by_module["embed_tokens"]
                continue
            if not any(hf_name in entries for hf_name in hf_names):
                continue
            param = model.get_submodule(name).weight
            if param.shape[1] % KERNEL_GROUP:
                _copy_dequantized(model, dict(iter_block_file(path, set(hf_names) & set(entries))))
                continue
            parts, start = [], 0  # (format, rows, the entry or the loaded float32 rows)
            for hf_name, (_, size_field) in zip(hf_names, hf_parts_):
                rows = param.shape[0] if size_field is None else getattr(config, size_field)
                if hf_name in entries:
                    entry = entries[hf_name]
                    if (entry.rows, entry.cols) != (rows, param.shape[1]):
                        raise ModelFormatError(path, f"tensor {hf_name!r} has shape ({entry.rows}, {entry.cols}), "
                                               f"expected ({rows}, {param.shape[1]})")
                    parts.append((entry.format, hf_name, entry))
                else:  # loaded float32: its own values, as F32 blocks
                    parts.append(("F32", hf_name, param.data[start:start + rows]))
                start += rows
            by_module[name] = [_read_run(path, file, run, param.shape[1]) for run in _runs(parts)]
    return by_module


def _runs(parts: list[tuple]) -> list[list[tuple]]:
    """Consecutive parts of one format."""
    runs: list[list[tuple]] = []
    for part in parts:
        if runs and runs[-1][0][0] == part[0]:
            runs[-1].append(part)
        else:
            runs.append([part])
    return runs


def _read_run(path: Path, file, run: list[tuple], cols: int) -> BlockWeight:
    """One BlockWeight of a run of parts of one format, each read into its rows."""
    format_name = run[0][0]
    spec = block_format(format_name)
    if spec.widened_scales:  # the run-time layout is not the file's: convert each part, then fuse
        weights = []
        for _, hf_name, entry in run:
            gguf_rows = np.empty((entry.rows, entry.row_bytes), dtype=np.uint8)
            read_blocks_into(path, file, hf_name, entry, gguf_rows)
            weights.append(BlockWeight.from_gguf(format_name, gguf_rows, cols))
        return weights[0] if len(weights) == 1 else BlockWeight.concat(weights)
    row_bytes = cols // spec.block_size * spec.bytes
    total_rows = sum(entry.rows if isinstance(entry, BlockEntry) else entry.shape[0] for _, _, entry in run)
    blocks = torch.empty((total_rows, row_bytes), dtype=torch.uint8)
    first = 0
    for _, hf_name, entry in run:
        if isinstance(entry, BlockEntry):
            read_blocks_into(path, file, hf_name, entry, blocks[first:first + entry.rows].numpy())
            first += entry.rows
        else:
            blocks[first:first + entry.shape[0]].copy_(entry.contiguous().view(torch.uint8))
            first += entry.shape[0]
    return BlockWeight(format_name, blocks, cols)


def _copy_dequantized(model: DecoderForCausalLM, read: dict) -> None:
    slices = _parameter_slices(model)
    for hf_name, part in read.items():
        param, start, end = slices[hf_name]
        param.data[start:end].copy_(dequantize_reference(BlockWeight.from_gguf(part.format, part.rows, part.cols)))

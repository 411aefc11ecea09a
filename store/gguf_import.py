"""Converting a GGUF file into the HF-style model directory the engine loads.

Out come config.json, generation_config.json, tokenizer.json and tokenizer_config.json,
gguf_blocks.safetensors: every 2-D weight of a block type the kernels read (quantized,
F16, BF16) as the file stores it (uint8 rows of blocks, same HF names, q/k rows
un-permuted; store/block_file.py), with no float32 copy, and model.safetensors: the rest
(norms, biases, F32 matrices, matrices not a whole number of 32-weight groups wide), float32.
Supported: the families of store/gguf_families.py (llama: SmolLM, Llama 2/3.x,
Mistral/Ministral; qwen2, qwen3, gemma2, gemma3, phi3), whose config.json it
builds and whose converter changes it undoes. Everything else is refused with
the file, the architecture and the supported list named.

The safetensors file is written tensor by tensor: its header needs only the
shapes, which the GGUF states up front, so each tensor is dequantized, written
and dropped, and peak memory stays near one tensor plus the reader's mmap.
"""

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize
from tqdm import tqdm

from store.block_file import BLOCK_FORMATS, BLOCKS_FILE
from store.checkpoint_names import GGUF_CONFIG_TENSORS, hf_tensor_name
from store.errors import ModelFormatError
from store.gguf_families import (
    architecture_of,
    build_config,
    check_supported,
    float32_shortest,
    permutes_qk_rows,
    undo_converter_changes,
    unpermute_rope_rows,
)
from store.gguf_tokenizer import build_tokenizer, special_token_str

# Bumped when the converter's output changes, so models converted earlier are redone.
CONVERTER_VERSION = 5

GGUF_MAGIC = b"GGUF"

class TensorSpec(NamedTuple):
    """One tensor of the output: its HF name and shape, and the GGUF tensor it comes from."""

    hf_name: str
    shape: tuple[int, ...]  # row-major, as HF stores it
    gguf_index: int


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Convert `gguf_path` into the model directory `out_dir` (created if missing).

    Writes straight into `out_dir`: callers wanting all-or-nothing write into a
    temporary directory and rename it (model_store does). Raises
    ModelFormatError for a corrupt or truncated file or an unsupported model.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = open_gguf(gguf_path)
    metadata = read_metadata(reader)
    check_supported(metadata.get("general.architecture"), gguf_path)
    config = build_config(metadata, [t.name for t in reader.tensors], read_config_tensors(reader), gguf_path)
    tokenizer = build_tokenizer(metadata, gguf_path)
    specs = tensor_specs(reader, config, gguf_path)

    out_dir.mkdir(parents=True, exist_ok=True)
    block_specs = [spec for spec in specs if _kept_as_blocks(reader, spec)]
    float_specs = [spec for spec in specs if spec not in block_specs]
    write_safetensors(out_dir / "model.safetensors", float_specs, _hf_arrays(reader, float_specs, config, progress))
    if block_specs:
        write_block_safetensors(out_dir / BLOCKS_FILE, reader, block_specs, config)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json",
                {**generation_config(metadata, config), **sampling_generation_config(metadata)})
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(metadata, tokenizer, config))
    return out_dir


def open_gguf(gguf_path: Path) -> GGUFReader:
    """A reader over `gguf_path` whose every tensor is backed by complete data."""
    try:
        with open(gguf_path, "rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as error:
        raise ModelFormatError(gguf_path, f"cannot read: {error.strerror or error}") from None
    if magic != GGUF_MAGIC:
        raise ModelFormatError(gguf_path, "not a GGUF file (bad magic bytes)")
    try:
        reader = GGUFReader(gguf_path)
    except (ValueError, KeyError, IndexError, struct.error, UnicodeDecodeError) as error:
        # the reader fails on a cut file with numpy's words (reshape / dtype sizes)
        raise ModelFormatError(gguf_path, f"truncated or corrupt GGUF file ({error})") from None
    for tensor in reader.tensors:
        if tensor.data.nbytes != tensor.n_bytes:
            raise ModelFormatError(gguf_path, f"truncated GGUF file: tensor {tensor.name} is incomplete")
    return reader


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """The file's key/value pairs as plain Python values (str, int, float, bool, lists)."""
    metadata = {}
    for key, field in reader.fields.items():
        if not field.types or key.startswith("GGUF."):
            continue
        if field.types[0] == GGUFValueType.ARRAY and field.types[-1] == GGUFValueType.STRING:
            # contents() decodes strings one numpy view at a time; this is the same, faster
            metadata[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        else:
            metadata[key] = field.contents()
    return metadata


def read_config_tensors(reader: GGUFReader) -> dict[str, np.ndarray]:
    """The file's tensors that are config (RoPE factors), as float32 arrays, by GGUF name."""
    return {tensor.name: dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(-1)
            for tensor in reader.tensors if tensor.name in GGUF_CONFIG_TENSORS}


def tensor_specs(reader: GGUFReader, config: dict[str, Any], gguf_path: Path) -> list[TensorSpec]:
    """HF name and shape of every tensor to write, in the file's order."""
    specs = []
    architecture = architecture_of(config)
    for index, tensor in enumerate(reader.tensors):
        if tensor.name in GGUF_CONFIG_TENSORS:
            continue  # in config.json
        hf_name = hf_tensor_name(tensor.name, architecture)
        if hf_name is None:
            raise ModelFormatError(gguf_path, f"unexpected tensor {tensor.name} for a {config['model_type']} model")
        # GGUF lists dimensions fastest-first; HF wants them row-major
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        specs.append(TensorSpec(hf_name, shape, index))
    hf_names = {spec.hf_name for spec in specs}
    missing = [name for name in ("model.embed_tokens.weight", "model.norm.weight") if name not in hf_names]
    if missing:
        raise ModelFormatError(gguf_path, f"missing tensors: {', '.join(missing)}")
    return specs


def _hf_arrays(
    reader: GGUFReader, specs: list[TensorSpec], config: dict[str, Any], progress: bool
) -> Iterator[np.ndarray]:
    """Each spec's tensor, dequantized to float32 and in HF layout, one at a time."""
    for spec in tqdm(specs, desc="converting GGUF tensors", unit="tensor", disable=not progress):
        tensor = reader.tensors[spec.gguf_index]
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False).reshape(spec.shape)
        yield undo_converter_changes(array, spec.hf_name, config)


# The C kernels multiply 32 weights at a time (kernels/block_formats.py KERNEL_GROUP): an F16 or
# BF16 matrix not that wide stays float32. Every quantized type's blocks are 32 or 256 wide.
KERNEL_GROUP = 32


def _kept_as_blocks(reader: GGUFReader, spec: TensorSpec) -> bool:
    """Whether a tensor goes to the block file: a 2-D weight of a block type the kernels read.
    F32 matrices stay in model.safetensors: float32 is their own form, not a copy."""
    type_name = reader.tensors[spec.gguf_index].tensor_type.name
    return (len(spec.shape) == 2 and type_name in BLOCK_FORMATS and type_name != "F32"
            and spec.shape[1] % KERNEL_GROUP == 0)


def _block_rows(reader: GGUFReader, spec: TensorSpec, config: dict[str, Any]) -> np.ndarray:
    """The raw blocks of a 2-D tensor, (rows, bytes per row) uint8, rows in HF order."""
    rows = np.asarray(reader.tensors[spec.gguf_index].data).view(np.uint8).reshape(spec.shape[0], -1)
    if permutes_qk_rows(config):
        # blocks run along a row, so un-permuting rows moves whole rows of blocks
        if ".self_attn.q_proj." in spec.hf_name:
            rows = unpermute_rope_rows(rows, config["num_attention_heads"])
        elif ".self_attn.k_proj." in spec.hf_name:
            rows = unpermute_rope_rows(rows, config["num_key_value_heads"])
    return np.ascontiguousarray(rows)


def generation_config(metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """generation_config.json: the special ids; the end-of-turn token (Gemma's <end_of_turn>, ...)
    stops generation too, as in the families' own generation_config.json."""
    generation = {key: config[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")
                  if config.get(key) is not None}
    end_of_turn = metadata.get("tokenizer.ggml.eot_token_id")
    if end_of_turn is not None and "eos_token_id" in generation and end_of_turn != generation["eos_token_id"]:
        generation["eos_token_id"] = [generation["eos_token_id"], end_of_turn]
    return generation


# GGUF's general.sampling.* keys (llama.cpp's defaults for the model) -> generation_config.json's (HF's names),
# which the server reads as its defaults for what a request leaves out (server/generation_defaults.py)
GGUF_SAMPLING_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
                      "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
                      "general.sampling.penalty_repeat": "repetition_penalty"}


def sampling_generation_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """The sampling values the file recommends, under generation_config.json's keys (floats shortest, as
    llama.cpp stores them in float32)."""
    values = {}
    for gguf_key, hf_key in GGUF_SAMPLING_KEYS.items():
        if gguf_key in metadata:
            value = metadata[gguf_key]
            values[hf_key] = value if hf_key == "top_k" else float32_shortest(value)
    return values


def _tokenizer_config(metadata: dict[str, Any], tokenizer, config: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json: special tokens, chat template and length, in transformers' spelling."""
    added = tokenizer.get_added_tokens_decoder()
    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "added_tokens_decoder": {
            str(token_id): {
                "content": token.content,
                "lstrip": token.lstrip,
                "normalized": token.normalized,
                "rstrip": token.rstrip,
                "single_word": token.single_word,
                "special": token.special,
            }
            for token_id, token in sorted(added.items())
        },
    }
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        tokenizer_config[name] = special_token_str(metadata, key)
    if "tokenizer.chat_template" in metadata:
        tokenizer_config["chat_template"] = metadata["tokenizer.chat_template"]
    return tokenizer_config


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --- safetensors, written one tensor at a time -------------------------------------------------
# Layout: 8-byte little-endian header length, JSON header {name: {dtype, shape, data_offsets}},
# then each tensor's raw little-endian bytes, back to back, in header order.

_HEADER_ALIGN_BYTES = 8  # the data section starts 8-byte aligned, as safetensors itself writes it
_F32_BYTES = 4


def write_safetensors(
    path: Path,
    specs: list[TensorSpec],
    arrays: Iterator[np.ndarray],
    dtype: str = "F32",
    metadata: dict[str, str] | None = None,
) -> None:
    """Write `arrays` (yielded lazily, in the order of `specs`, float32 or, with
    dtype "U8", uint8) to `path`."""
    numpy_dtype, item_bytes = {"F32": ("<f4", _F32_BYTES), "U8": ("u1", 1)}[dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    offset = 0
    for spec in specs:
        num_bytes = int(np.prod(spec.shape, dtype=np.int64)) * item_bytes
        header[spec.hf_name] = {"dtype": dtype, "shape": list(spec.shape), "data_offsets": [offset, offset + num_bytes]}
        offset += num_bytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-(8 + len(header_bytes)) % _HEADER_ALIGN_BYTES)

    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for spec, array in zip(specs, arrays, strict=True):
            if tuple(array.shape) != spec.shape:
                raise ValueError(f"tensor {spec.hf_name}: got shape {array.shape}, header says {spec.shape}")
            f.write(np.ascontiguousarray(array, dtype=numpy_dtype).data)


def write_block_safetensors(path: Path, reader: GGUFReader, specs: list[TensorSpec], config: dict[str, Any]) -> None:
    """The 2-D tensors of `specs` as uint8 block rows; the header's
    metadata names each tensor's block format ({"block_formats": JSON})."""
    block_specs = [
        TensorSpec(spec.hf_name, (spec.shape[0], int(reader.tensors[spec.gguf_index].n_bytes) // spec.shape[0]),
                   spec.gguf_index)
        for spec in specs
    ]
    arrays = (_block_rows(reader, spec, config) for spec in specs)  # one tensor at a time
    formats = {spec.hf_name: reader.tensors[spec.gguf_index].tensor_type.name for spec in specs}
    write_safetensors(path, block_specs, arrays, dtype="U8", metadata={"block_formats": json.dumps(formats)})

"""The GGUF block copies of a converted model's weights (gguf_blocks.safetensors).

A model converted from a GGUF file keeps its 2-D weights' blocks, as the file stores them
(q/k rows un-permuted), in this file instead of a float32 copy (store/gguf_import.py): the
CPU backend runs on them (kernels/block_formats.py, the run-time layouts), the torch
backend dequantizes them at load. model.safetensors holds only what is not here (norms).

Tensors are read with plain file reads, not mmap: a mapped file's touched pages count in the
process's resident memory until unmapped, so mmap would show every weight twice at load.
"""

import json
import os
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from store.errors import ModelFormatError

BLOCKS_FILE = "gguf_blocks.safetensors"
# The GGUF types kept as blocks: those the CPU kernels read (kernels/block_formats.py FORMATS holds
# their run-time layouts; store imports nothing of kernels, so a test holds the two lists equal).
# A block's size and bytes as the file stores it are gguf's own table (GGML_QUANT_SIZES).
BLOCK_FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                 "F16", "BF16", "F32")


class GGUFBlocks(NamedTuple):
    """One tensor's blocks as GGUF stores them: rows (rows, cols / block_size * type_size) uint8."""

    format: str
    rows: np.ndarray
    cols: int


def gguf_block_shape(block_format: str) -> tuple[int, int]:
    """(weights per block, bytes per block) as GGUF stores `block_format`."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[block_format]]


def block_file_formats(model_dir: Path) -> dict[str, str]:
    """HF tensor name -> block format of the model's block file; empty without one."""
    path = Path(model_dir) / BLOCKS_FILE
    if not path.is_file():
        return {}
    header, _ = _read_header(path)
    return json.loads(header.get("__metadata__", {}).get("block_formats", "{}"))


def read_block_file(model_dir: Path, names: set[str] | None = None) -> dict[str, GGUFBlocks]:
    """HF tensor name -> its blocks (those in `names`, or all); empty when the model directory has none."""
    path = Path(model_dir) / BLOCKS_FILE
    if not path.is_file():
        return {}
    return dict(iter_block_file(path, names))


class BlockEntry(NamedTuple):
    """Where one tensor's blocks lie in the block file: (rows, row_bytes) uint8 from `offset`."""

    format: str
    rows: int
    row_bytes: int
    cols: int  # weights a row
    offset: int  # from the start of the file


def block_entries(path: Path) -> dict[str, BlockEntry]:
    """HF name -> its entry, for every tensor of the block file, checked against the header."""
    header, data_start = _read_header(path)
    formats = json.loads(header.get("__metadata__", {}).get("block_formats", "{}"))
    entries = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if name not in formats:
            raise ModelFormatError(path, f"tensor {name!r} has no block format in the header")
        if formats[name] not in BLOCK_FORMATS:
            raise ModelFormatError(path, f"block format {formats[name]!r} is not supported "
                                   f"({', '.join(BLOCK_FORMATS)})")
        begin, end = entry["data_offsets"]
        rows, row_bytes = entry["shape"]
        if entry["dtype"] != "U8" or end - begin != rows * row_bytes:
            raise ModelFormatError(path, f"tensor {name!r}: bad entry {entry}")
        block_size, type_size = gguf_block_shape(formats[name])
        if row_bytes % type_size:
            raise ModelFormatError(path, f"tensor {name!r}: rows of {row_bytes} bytes are not whole "
                                   f"{formats[name]} blocks of {type_size}")
        entries[name] = BlockEntry(formats[name], rows, row_bytes, row_bytes // type_size * block_size,
                                   data_start + begin)
    return entries


def read_blocks_into(path: Path, file, name: str, entry: BlockEntry, out: np.ndarray) -> None:
    """Reads the entry's bytes from the open `file` straight into `out` (C-contiguous uint8 of
    entry.rows * entry.row_bytes bytes): the loader places each part where the run-time weight
    keeps it, so a load makes no transient copy of the weights."""
    if out.dtype != np.uint8 or not out.flags.c_contiguous or out.nbytes != entry.rows * entry.row_bytes:
        raise ValueError(f"tensor {name!r}: needs a contiguous uint8 buffer of {entry.rows * entry.row_bytes} "
                         f"bytes, got {out.dtype} {out.shape}")
    try:
        file.seek(entry.offset)
        if file.readinto(memoryview(out).cast("B")) != out.nbytes:
            raise ModelFormatError(path, f"truncated: tensor {name!r} is incomplete")
    except OSError as error:
        raise ModelFormatError(path, f"unreadable ({error.strerror or error})") from None


def iter_block_file(path: Path, names: set[str] | None = None):
    """(HF name, GGUFBlocks) one tensor at a time, read from the file (no mmap)."""
    entries = block_entries(path)
    try:
        with open(path, "rb") as file:
            for name, entry in entries.items():
                if names is not None and name not in names:
                    continue
                array = np.empty((entry.rows, entry.row_bytes), dtype=np.uint8)
                read_blocks_into(path, file, name, entry, array)
                yield name, GGUFBlocks(entry.format, array, entry.cols)
    except OSError as error:
        raise ModelFormatError(path, f"unreadable ({error.strerror or error})") from None


def _read_header(path: Path) -> tuple[dict, int]:
    """The safetensors JSON header and where the data starts."""
    try:
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            if length > os.path.getsize(path):
                raise ValueError("header longer than the file")
            header = json.loads(file.read(length))
    except (OSError, ValueError, struct.error) as error:
        raise ModelFormatError(path, f"unreadable block weights ({error})") from None
    if not isinstance(header, dict):
        raise ModelFormatError(path, "unreadable block weights (header is not an object)")
    return header, 8 + length

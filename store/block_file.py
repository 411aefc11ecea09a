"""The GGUF block copies of a converted model's weights (gguf_blocks.safetensors).

A model converted from a GGUF file keeps its Q4_1 / Q8_0 tensors' blocks, as the
file stores them, beside the float32 weights (store/gguf_import.py). Both hold the
same values: the float32 file is the blocks' dequantization. The CPU backend's
few-row products read the blocks, 6 or 9 bits a weight instead of 32
(kernels/cpu_matvec.py); larger batches and prefill run the float32 GEMM.
"""

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
from safetensors import SafetensorError, safe_open

from store.errors import ModelFormatError

BLOCKS_FILE = "gguf_blocks.safetensors"
BLOCK_SIZE = 32  # weights per block along a row, both formats
# The formats kept, those the CPU kernels read (kernels/cpu_matvec.py; a test holds the two
# lists equal), as GGUF stores a block: Q4_1 {fp16 d, fp16 min, 16 B of nibbles}, Q8_0 {fp16 d, 32 int8}.
GGUF_BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}


class GGUFBlocks(NamedTuple):
    """One tensor's blocks as GGUF stores them: rows (rows, cols / 32 * GGUF_BLOCK_BYTES) uint8."""

    format: str
    rows: np.ndarray
    cols: int


def read_block_file(model_dir: Path) -> dict[str, GGUFBlocks]:
    """HF tensor name -> its blocks; empty when the model directory has none."""
    path = Path(model_dir) / BLOCKS_FILE
    if not path.is_file():
        return {}
    try:
        with safe_open(str(path), framework="np", device="cpu") as file:
            formats = json.loads((file.metadata() or {}).get("block_formats", "{}"))
            weights = {}
            for name in file.keys():
                if name not in formats:
                    raise ModelFormatError(path, f"tensor {name!r} has no block format in the header")
                gguf_rows = file.get_tensor(name)
                cols = gguf_rows.shape[1] // _bytes_per_block(path, formats[name]) * BLOCK_SIZE
                weights[name] = GGUFBlocks(formats[name], gguf_rows, cols)
            return weights
    except (SafetensorError, ValueError) as error:
        raise ModelFormatError(path, f"unreadable block weights ({error})") from None
    except OSError as error:
        raise ModelFormatError(path, f"unreadable ({error.strerror or error})") from None


def _bytes_per_block(path: Path, block_format: str) -> int:
    if block_format not in GGUF_BLOCK_BYTES:
        raise ModelFormatError(path, f"block format {block_format!r} is not supported "
                               f"({', '.join(GGUF_BLOCK_BYTES)})")
    return GGUF_BLOCK_BYTES[block_format]

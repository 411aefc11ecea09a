"""The GGUF block copies of a converted model's weights (gguf_blocks.safetensors).

A model converted from a GGUF file keeps its Q4_1 / Q8_0 tensors' blocks
beside the float32 weights (store/gguf_import.py). Both hold the same values:
the float32 file is the blocks' dequantization. Projections with few input
rows (decode steps) read the blocks, 6 or 9 bits a weight instead of 32
(kernels/cpu_matvec.py); larger batches and prefill run the float32 GEMM.
"""

import json
from pathlib import Path

from safetensors import SafetensorError, safe_open

from store.errors import ModelFormatError
from store.gguf_import import BLOCKS_FILE
from kernels.cpu_matvec import BLOCK_SIZE, GGUF_BLOCK_BYTES, BlockWeight


def read_block_weights(model_dir: Path) -> dict[str, BlockWeight]:
    """HF tensor name -> its blocks; empty when the model directory has none."""
    path = Path(model_dir) / BLOCKS_FILE
    if not path.is_file():
        return {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as file:
            formats = json.loads((file.metadata() or {}).get("block_formats", "{}"))
            weights = {}
            for name in file.keys():
                if name not in formats:
                    raise ModelFormatError(path, f"tensor {name!r} has no block format in the header")
                gguf_rows = file.get_tensor(name).numpy()
                cols = gguf_rows.shape[1] // _bytes_per_block(path, formats[name]) * BLOCK_SIZE
                weights[name] = BlockWeight.from_gguf(formats[name], gguf_rows, cols)
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


def fused(weights: dict[str, BlockWeight], names: list[str]) -> BlockWeight | None:
    """The row-wise concatenation of `names` (q|k|v, gate|up), or None when any
    part has no blocks or the parts' formats differ (that projection then stays float32)."""
    parts = [weights.get(name) for name in names]
    if any(part is None for part in parts) or len({part.format for part in parts}) != 1:
        return None
    return parts[0] if len(parts) == 1 else BlockWeight.concat(parts)

"""The name of a KV tier: which model, dtype, page size and KV layout its pages were computed with.

A page is only reusable by an engine that would have computed the very same values, so the
fingerprint covers:
  - the weights: config.json, the conversion record (radixserve_source.json: the GGUF's size and
    mtime for a converted model), and for each *.safetensors file its name, size, mtime and
    header (every tensor's name, dtype, shape and offsets). Reading the headers, not the
    gigabytes, keeps start-up instant; a weight file rewritten in place gets a new mtime, so any
    change to the weights is a new tier (the old one is simply never read again).
  - the dtype, page size, number of layers, KV heads and head dim, the device type and the
    payload layout version of engine/kv_tier_link.py.
"""

import hashlib
import json
import struct
from pathlib import Path

from cache.page_file import FINGERPRINT_NUM_BYTES
from store.model_store import SOURCE_RECORD

# Bump when the byte layout of a page's payload changes (engine/kv_tier_link.py).
KV_PAYLOAD_LAYOUT_VERSION = 1
_MAX_SAFETENSORS_HEADER_BYTES = 100 << 20  # the format's own limit


def kv_tier_fingerprint(
    model_dir: Path,
    dtype_name: str,
    device_type: str,
    page_size: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
) -> bytes:
    digest = hashlib.sha256(b"radixserve kv tier\n")
    layout = {
        "payload_layout": KV_PAYLOAD_LAYOUT_VERSION,
        "dtype": dtype_name,
        "device_type": device_type,
        "page_size": page_size,
        "num_layers": num_layers,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
    }
    digest.update(json.dumps(layout, sort_keys=True).encode())
    model_dir = Path(model_dir)
    for name in ("config.json", SOURCE_RECORD):
        path = model_dir / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"(absent)")
    for path in sorted(model_dir.glob("*.safetensors")):
        stat = path.stat()
        digest.update(f"\0{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        digest.update(_safetensors_header(path))
    return digest.digest()[:FINGERPRINT_NUM_BYTES]


def _safetensors_header(path: Path) -> bytes:
    with open(path, "rb") as file:
        length_bytes = file.read(8)
        if len(length_bytes) < 8:
            return length_bytes
        (header_len,) = struct.unpack("<Q", length_bytes)
        return length_bytes + file.read(min(header_len, _MAX_SAFETENSORS_HEADER_BYTES))

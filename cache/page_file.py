"""The file that holds one piece of KV in a disk tier: a fixed header, then its bytes.

Two kinds share the format (KVFileKind: magic and name suffix): a KV page (PAGE_FILE, keyed by its
chained page hash) and a document span of the document KV store (SPAN_FILE, keyed by the hash of its
token ids and salt, cache/document_disk.py).

    offset  size  field
    0       8     magic b"RSKVPAGE" (a page) or b"RSKVSPAN" (a document span)
    8       4     format version (uint32 LE)
    12      16    tier fingerprint: model, dtype, page size, KV layout (see engine/kv_tier_fingerprint.py)
    28      16    the key: chained page hash of the prefix this page ends (cache/page_hash.py), or a span's key hash
    44      8     payload length in bytes (uint64 LE)
    52      8     checksum: xxh3-64 of bytes [0, 52) and the payload (uint64 LE)
    60      ...   payload: the page's K and V for every layer, as the engine lays them out (a span: its
                  key and position, then its KV; cache/document_disk.py)

A file that is truncated, torn by a crash, written for another fingerprint or another key,
or altered in any byte fails `check_page_file` with PageFileError: the reader treats it as
a miss, never as KV. Files are written to a temporary name and renamed (cache/disk_tier_writer.py),
so a finished name only ever points at a complete write; the checksum covers what rename cannot
(a power cut that loses the tail of a renamed file, a bad sector, an edit by hand). xxh3-64 is a
checksum for exactly such accidents (not against an adversary who can write the directory
anyway): it misses a random change with odds 2^-64, and runs at ~60 GB/s against ~0.5 GB/s for
zlib's CRC-32 and ~0.2 GB/s for blake2b measured here, which matters because a load checks every
page it serves, on the engine thread.
"""

import struct
from typing import NamedTuple

import xxhash


class KVFileKind(NamedTuple):
    magic: bytes  # 8 bytes, the file's first
    suffix: str  # of its name: <key hex><suffix>
    what: str  # what one file holds, for messages


PAGE_FILE = KVFileKind(b"RSKVPAGE", ".kvpage", "page")
SPAN_FILE = KVFileKind(b"RSKVSPAN", ".kvspan", "document span")
PAGE_FILE_MAGIC = PAGE_FILE.magic
PAGE_FILE_VERSION = 1
PAGE_FILE_SUFFIX = PAGE_FILE.suffix
FINGERPRINT_NUM_BYTES = 16
_KEY_NUM_BYTES = 16
_PREFIX = struct.Struct(f"<8sI{FINGERPRINT_NUM_BYTES}s{_KEY_NUM_BYTES}sQ")  # the fields the checksum covers first
_CHECKSUM = struct.Struct("<Q")
HEADER_NUM_BYTES = _PREFIX.size + _CHECKSUM.size  # 60


class PageFileError(Exception):
    """The bytes are not a valid file of this kind for this tier and key; the message says why."""


def page_file_name(page_hash: bytes, kind: KVFileKind = PAGE_FILE) -> str:
    return page_hash.hex() + kind.suffix


def page_hash_of_file_name(name: str, kind: KVFileKind = PAGE_FILE) -> bytes | None:
    """The key a file's name stands for, or None when the name is not one of this kind."""
    if not name.endswith(kind.suffix):
        return None
    stem = name[: -len(kind.suffix)]
    if len(stem) != 2 * _KEY_NUM_BYTES:
        return None
    try:
        return bytes.fromhex(stem)
    except ValueError:
        return None


def page_file_num_bytes(payload_num_bytes: int) -> int:
    return HEADER_NUM_BYTES + payload_num_bytes


def page_file_header(fingerprint: bytes, page_hash: bytes, payload, kind: KVFileKind = PAGE_FILE) -> bytes:
    """The header to write before ``payload`` (any buffer: bytes, memoryview, a numpy array)."""
    _check_ids(fingerprint, page_hash)
    payload_view = memoryview(payload).cast("B")
    prefix = _PREFIX.pack(kind.magic, PAGE_FILE_VERSION, fingerprint, page_hash, payload_view.nbytes)
    return prefix + _checksum(prefix, payload_view)


def check_page_file(header: bytes, payload, fingerprint: bytes, page_hash: bytes,
                    kind: KVFileKind = PAGE_FILE) -> None:
    """Raise PageFileError unless ``header`` + ``payload`` are the intact file of key ``page_hash``
    of the tier ``fingerprint`` (``payload``: the bytes after the header, already read)."""
    if len(header) != HEADER_NUM_BYTES:
        raise PageFileError(f"header of {len(header)} bytes, expected {HEADER_NUM_BYTES}")
    prefix = header[: _PREFIX.size]
    magic, version, file_fingerprint, file_page_hash, payload_num_bytes = _PREFIX.unpack(prefix)
    if magic != kind.magic:
        raise PageFileError(f"not a {kind.what} file (bad magic)")
    if version != PAGE_FILE_VERSION:
        raise PageFileError(f"page file format {version}, this build reads {PAGE_FILE_VERSION}")
    if file_fingerprint != fingerprint:
        raise PageFileError("written for another model or KV layout (fingerprint differs)")
    if file_page_hash != page_hash:
        raise PageFileError(f"holds another {kind.what} (page hash differs from its name)")
    payload_view = memoryview(payload).cast("B")
    if payload_num_bytes != payload_view.nbytes:
        raise PageFileError(f"payload of {payload_view.nbytes} bytes, header says {payload_num_bytes}")
    if _checksum(prefix, payload_view) != header[_PREFIX.size :]:
        raise PageFileError("checksum mismatch (torn or corrupt)")


def _checksum(prefix: bytes, payload_view: memoryview) -> bytes:
    digest = xxhash.xxh3_64(prefix)
    digest.update(payload_view)
    return _CHECKSUM.pack(digest.intdigest())


def _check_ids(fingerprint: bytes, page_hash: bytes) -> None:
    if len(fingerprint) != FINGERPRINT_NUM_BYTES:
        raise ValueError(f"a tier fingerprint is {FINGERPRINT_NUM_BYTES} bytes, got {len(fingerprint)}")
    if len(page_hash) != _KEY_NUM_BYTES:
        raise ValueError(f"a page hash is {_KEY_NUM_BYTES} bytes, got {len(page_hash)}")

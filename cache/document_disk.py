"""The document KV store's spans on disk: one file per entry in `documents/` of a disk tier's directory.

Same rules as the tier's pages, by the same code (cache/kv_file_directory.py): written by the
background writer to a temporary name and renamed, fingerprint + key + checksum in the file and
checked on load (a torn, foreign or corrupt file is a miss, and deleted), the index rebuilt at start
from names and sizes in mtime order, bounded in bytes with LRU deletion. The directory sits inside
the tier's fingerprinted, locked directory, so another model, dtype or KV layout never reads it and
no other process writes in it.

A file's name is the hash of its key (token ids + cache salt, so tenants stay apart on disk too);
its payload (SPAN_FILE, cache/page_file.py) is

    0   4   M: length of the record (uint32 LE)
    4   M   the record, JSON: {"token_ids", "salt", "position", "predecessor": [token ids, salt] | null,
                                "lead_ids": the lead tokens whose KV rows come first}
    ... zero bytes up to the next multiple of 64 (the KV's alignment)
    ... the KV, as the engine lays it out (engine/document_kv_disk.py)

and a read checks that the record's key is the one asked for (two keys of one hash are both misses).
Bytes only: the engine turns tensors into bytes and back.
"""

import hashlib
import json
import logging
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from cache.document_store import DocumentKey
from cache.kv_file_directory import KVFileDirectory, KVFileStats
from cache.page_file import SPAN_FILE
from cache.page_hash import PAGE_HASH_NUM_BYTES, encode_cache_salt

logger = logging.getLogger("radixserve.kv_tier")

DOCUMENTS_SUBDIRECTORY = "documents"
DEFAULT_MAX_PENDING_BYTES = 256 << 20  # payload queued for the writer before writes are dropped
_KV_ALIGNMENT = 64
_RECORD_LENGTH = struct.Struct("<I")


def document_key_hash(key: DocumentKey) -> bytes:
    """16 bytes naming (token ids, salt): blake2b over a tag, the salt's encoding (cache/page_hash.py)
    and the ids as uint32 LE."""
    token_ids, cache_salt = key
    digest = hashlib.blake2b(b"radixserve document span\n", digest_size=PAGE_HASH_NUM_BYTES)
    digest.update(encode_cache_salt(cache_salt))
    digest.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return digest.digest()


class StoredSpan(NamedTuple):
    position: int  # where its first token was computed
    predecessor: DocumentKey | None
    kv: memoryview  # the engine's KV bytes (writable, its own buffer)
    lead_ids: tuple[int, ...] = ()  # cache/document_store.py DocumentEntry.lead_ids


class DocumentDisk:
    """``directory``: inside a directory its owner holds locked (cache/disk_tier_lock.py)."""

    def __init__(self, directory: Path, fingerprint: bytes, max_bytes: int,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES, on_store: Callable[[float], None] | None = None):
        self._files = KVFileDirectory(directory, fingerprint, SPAN_FILE, max_bytes, max_pending_bytes,
                                      on_store=on_store, thread_name="radixserve-document-disk-writer")
        self.directory = self._files.directory

    def contains(self, key: DocumentKey) -> bool:
        return self._files.contains(document_key_hash(key))

    def put(self, key: DocumentKey, position: int, predecessor: DocumentKey | None, kv_parts: Sequence,
            lead_ids: Sequence[int] = ()) -> bool:
        """Queue the span (``kv_parts``: buffers whose bytes, one after the other, are the engine's KV;
        copied here, so the caller may change them later). False when not taken (held already, queue
        full, larger than the bound)."""
        token_ids, cache_salt = key
        record = {"token_ids": list(token_ids), "salt": cache_salt, "position": position,
                  "predecessor": None if predecessor is None else [list(predecessor[0]), predecessor[1]],
                  "lead_ids": list(lead_ids)}
        record_bytes = json.dumps(record, separators=(",", ":")).encode()
        kv_views = [memoryview(part).cast("B") for part in kv_parts]
        kv_start = -(-(_RECORD_LENGTH.size + len(record_bytes)) // _KV_ALIGNMENT) * _KV_ALIGNMENT
        payload = bytearray(kv_start + sum(view.nbytes for view in kv_views))
        payload[: _RECORD_LENGTH.size] = _RECORD_LENGTH.pack(len(record_bytes))
        payload[_RECORD_LENGTH.size : _RECORD_LENGTH.size + len(record_bytes)] = record_bytes
        offset = kv_start
        for view in kv_views:
            payload[offset : offset + view.nbytes] = view
            offset += view.nbytes
        return self._files.put(document_key_hash(key), payload)

    def read(self, key: DocumentKey) -> StoredSpan | None:
        """The span of ``key``, checked; None (a miss) when missing or damaged (then deleted)."""
        key_hash = document_key_hash(key)
        payload = self._files.read(key_hash)
        if payload is None:
            return None
        try:
            (record_num_bytes,) = _RECORD_LENGTH.unpack_from(payload)
            record = json.loads(bytes(payload[_RECORD_LENGTH.size : _RECORD_LENGTH.size + record_num_bytes]))
            kv_start = -(-(_RECORD_LENGTH.size + record_num_bytes) // _KV_ALIGNMENT) * _KV_ALIGNMENT
            if tuple(record["token_ids"]) != tuple(key[0]) or record["salt"] != key[1]:
                raise ValueError("holds another span (its key hash collides)")
            predecessor = record["predecessor"]
            stored = StoredSpan(int(record["position"]),
                                None if predecessor is None else (tuple(predecessor[0]), predecessor[1]),
                                payload[kv_start:], tuple(int(token) for token in record.get("lead_ids", ())))
        except (struct.error, ValueError, KeyError, TypeError, IndexError) as error:
            logger.warning("document KV on disk: %s is a miss: %s; deleted", key_hash.hex(), error)
            self._files.forget(key_hash)
            return None
        return stored

    def forget(self, key: DocumentKey) -> None:
        """Delete the file of ``key`` (what it holds is not what its reader expects)."""
        self._files.forget(document_key_hash(key))

    def stats(self) -> KVFileStats:
        return self._files.stats()

    def flush(self) -> None:
        self._files.flush()

    def close(self) -> None:
        self._files.close()

"""The document KV store's disk tier, on the engine side: (K, V) tensors to bytes and back.

With the KV disk tier configured, every document store entry is also written to `documents/` in the
tier's fingerprinted, locked directory (cache/document_disk.py: same restart-safety rules as the
pages, by the same code), within `DocumentReuseConfig.disk_bytes`. A lookup that misses memory
loads the entry from there on the engine thread (cache/document_store.py), so a restarted engine
reuses precomputed documents without computing them.

KV bytes of one entry (DOCUMENT_KV_LAYOUT_VERSION 1), contiguous, in the pool's K and V formats:

    K values (num_layers, L + T, num_kv_heads, head_dim), then for int8 K its scales (num_layers, L + T,
    num_kv_heads) float32, then V the same way; L lead rows (positions position - L .. position - 1),
    then the span's T (position .. position + T - 1). In float32: (2, num_layers, L + T, KVH, D).

The files' fingerprint is the tier's with this layout version folded in, so a change of either is
a foreign file (a miss).
"""

import hashlib
import logging
import math
import time

import torch

from cache.disk_tier import DiskTier
from cache.document_disk import DOCUMENTS_SUBDIRECTORY, DocumentDisk
from cache.document_store import DocumentKey, DocumentTier, LoadedDocument
from cache.kv_file_directory import KVFileStats
from cache.kv_pool import KVPoolShape
from cache.page_file import FINGERPRINT_NUM_BYTES
from engine.metrics import EngineMetrics
from kernels.kv_format import StoredRows, has_scales, value_dtype

logger = logging.getLogger("radixserve.kv_tier")

DOCUMENT_KV_LAYOUT_VERSION = 1


class DocumentKVDisk(DocumentTier):
    def __init__(self, disk: DocumentDisk, shape: KVPoolShape, device: torch.device,
                 metrics: EngineMetrics | None = None):
        self.disk = disk
        self._shape = shape
        self._device = device
        self._metrics = metrics

    def contains(self, key: DocumentKey) -> bool:
        return self.disk.contains(key)

    def store(self, key: DocumentKey, kv, position: int, predecessor: DocumentKey | None,
              lead_ids=()) -> bool:
        k, v = kv  # StoredRows (num_layers, L + T, KVH, D) each
        parts = [_host_bytes(plane) for rows in (k, v) for plane in (rows.values, rows.scales)
                 if plane is not None]  # copied into the write's payload by the disk
        return self.disk.put(key, position, predecessor, parts, lead_ids)

    def load(self, key: DocumentKey) -> LoadedDocument | None:
        started = time.perf_counter()
        stored = self.disk.read(key)
        if stored is None:
            return None
        shape = self._shape
        rows = (shape.num_layers, len(stored.lead_ids) + len(key[0]), shape.num_kv_heads)
        planes = [(kv_dtype, value_dtype(kv_dtype), (*rows, shape.head_dim)) for kv_dtype in
                  (shape.kv_dtype_k, shape.kv_dtype_v)]
        num_bytes = sum(math.prod(dims) * torch.empty((), dtype=dtype).element_size()
                        + (math.prod(rows) * 4 if has_scales(kv_dtype) else 0) for kv_dtype, dtype, dims in planes)
        if stored.kv.nbytes != num_bytes:
            logger.warning("document KV on disk: a span of %d tokens holds %d bytes of KV, expected %d; deleted",
                           len(key[0]), stored.kv.nbytes, num_bytes)
            self.disk.forget(key)
            return None
        payload = torch.frombuffer(stored.kv, dtype=torch.uint8)  # shares the read buffer
        halves, offset = [], 0
        for kv_dtype, dtype, dims in planes:
            values, offset = _take(payload, offset, dtype, dims)
            scales = None
            if has_scales(kv_dtype):
                scales, offset = _take(payload, offset, torch.float32, rows)
            halves.append(StoredRows(kv_dtype, values.to(self._device), None if scales is None
                                     else scales.to(self._device)))
        kv = tuple(halves)
        if self._metrics is not None:
            self._metrics.observe("document_disk_load", time.perf_counter() - started)
        return LoadedDocument(kv, num_bytes, stored.position, stored.predecessor, stored.lead_ids)

    def stats(self) -> KVFileStats:
        return self.disk.stats()

    def close(self) -> None:
        self.disk.close()


def open_document_kv_disk(tier: DiskTier, max_bytes: int, shape: KVPoolShape, device: torch.device,
                          metrics: EngineMetrics | None = None) -> DocumentKVDisk | None:
    """The document store's files in `documents/` of the disk tier's directory (locked by `tier`,
    which must be closed after this); None (and a warning) when that directory cannot be used."""
    digest = hashlib.blake2b(tier.fingerprint, digest_size=FINGERPRINT_NUM_BYTES)
    digest.update(f"documents, KV layout {DOCUMENT_KV_LAYOUT_VERSION}".encode())
    on_store = (lambda seconds: metrics.observe("document_disk_store", seconds)) if metrics is not None else None
    try:
        disk = DocumentDisk(tier.directory / DOCUMENTS_SUBDIRECTORY, digest.digest(), max_bytes, on_store=on_store)
    except OSError as error:
        logger.warning("radixserve: document KV on disk off: %s", error)
        return None
    stats = disk.stats()
    logger.info("radixserve: document KV on disk at %s holds %d spans (%.1f of %.1f MiB)", disk.directory,
                stats.num_files, stats.num_bytes / 2**20, stats.max_bytes / 2**20)
    return DocumentKVDisk(disk, shape, device, metrics)


def _host_bytes(tensor: torch.Tensor):
    """A uint8 numpy view of the tensor's bytes on the host (a copy only when not there, contiguous)."""
    return tensor.detach().to("cpu").contiguous().view(torch.uint8).reshape(-1).numpy()


def _take(payload: torch.Tensor, offset: int, dtype: torch.dtype, dims: tuple[int, ...]):
    """The tensor of `dims` in `dtype` at byte `offset` of payload (a view), and the offset after it."""
    num_bytes = math.prod(dims) * torch.empty((), dtype=dtype).element_size()
    return payload[offset:offset + num_bytes].view(dtype).view(dims), offset + num_bytes

"""The disk tier: KV pages as files under `<root>/<fingerprint>/`, one file per chained page hash.

Restart safety and the byte bound are those of every KV file directory (cache/kv_file_directory.py:
temporary name + rename by the background writer, fingerprint + key + checksum checked on every
load, index rebuilt from names and sizes in mtime order, LRU deletion before a write). Here: the
directory is locked by this process (cache/disk_tier_lock.py), so no other process writes or
deletes in it, and every page has the same size. Subfolders belong to other users of the same
locked directory (the document store's spans, `documents/`: cache/document_disk.py).
"""

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from cache.disk_tier_lock import lock_tier_directory
from cache.kv_file_directory import KVFileDirectory
from cache.kv_tier import KVTier, KVTierStats
from cache.page_file import PAGE_FILE, page_file_num_bytes

logger = logging.getLogger("radixserve.kv_tier")

DEFAULT_MAX_PENDING_BYTES = 256 << 20  # payload queued for the writer before stores are dropped


class DiskTier(KVTier):
    """``on_store(seconds)`` (optional) is called from the writer thread after each page written."""

    def __init__(
        self,
        root: Path,
        fingerprint: bytes,
        page_num_bytes: int,
        max_bytes: int,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        on_store: Callable[[float], None] | None = None,
    ):
        if page_num_bytes <= 0:
            raise ValueError(f"page_num_bytes must be positive, got {page_num_bytes}")
        self.fingerprint = fingerprint
        self.page_num_bytes = page_num_bytes
        self.file_num_bytes = page_file_num_bytes(page_num_bytes)
        self._directory_lock = lock_tier_directory(Path(root), fingerprint.hex())
        self.directory = self._directory_lock.path
        try:
            self._files = KVFileDirectory(self.directory, fingerprint, PAGE_FILE, max_bytes, max_pending_bytes,
                                          payload_num_bytes=page_num_bytes, on_store=on_store)
        except BaseException:
            self._directory_lock.release()
            raise
        self._is_closed = False

    # ---- KVTier ---------------------------------------------------------

    def contains(self, page_hash: bytes) -> bool:
        return self._files.contains(page_hash)

    def num_leading_hits(self, page_hashes: Sequence[bytes]) -> int:
        for num_hits, page_hash in enumerate(page_hashes):
            if not self.contains(page_hash):
                return num_hits
        return len(page_hashes)

    def store(self, page_hash: bytes, payload) -> bool:
        return self._files.put(page_hash, payload)

    def load_into(self, page_hash: bytes, out: memoryview) -> bool:
        out = out.cast("B")
        if out.nbytes != self.page_num_bytes:
            raise ValueError(f"a page of this tier is {self.page_num_bytes} bytes, got a buffer of {out.nbytes}")
        return self._files.read(page_hash, out) is not None

    def stats(self) -> KVTierStats:
        stats = self._files.stats()
        return KVTierStats(num_pages=stats.num_files, num_bytes=stats.num_bytes, max_bytes=stats.max_bytes,
                           num_dropped_pages=stats.num_dropped)

    def flush(self) -> None:
        self._files.flush()

    def close(self) -> None:
        """Flush and let go of the directory. Whoever uses its subfolders must be closed first."""
        if self._is_closed:
            return
        self._is_closed = True
        self._files.close()
        self._directory_lock.release()

"""The disk tier: KV pages as files under `<root>/<fingerprint>/`, one file per chained page hash.

Restart safety:
  - A page is written to a temporary name in the same directory and renamed into place
    (cache/disk_tier_writer.py runs the writes), so `<hash>.kvpage` is always a complete write.
  - Every file carries the tier's fingerprint, its key and a checksum (cache/page_file.py),
    checked on every load: a torn, truncated, corrupt or foreign file is a miss, and deleted.
  - The index is rebuilt at start from the directory (names and sizes only, no reads), in
    last-use order by mtime (a load bumps it); stale temporaries of a killed process are removed.
  - The directory is locked by this process (cache/disk_tier_lock.py); no other process writes
    or deletes in it.

Bounded: the files (temporaries included) never take more than ``max_bytes``; before a page is
written, the least recently used pages are deleted to make room.
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cache.disk_tier_index import LRUByteIndex
from cache.disk_tier_lock import lock_tier_directory
from cache.disk_tier_writer import PageWriteQueue
from cache.kv_tier import KVTier, KVTierStats
from cache.page_file import (
    HEADER_NUM_BYTES,
    PageFileError,
    check_page_file,
    page_file_header,
    page_file_name,
    page_file_num_bytes,
    page_hash_of_file_name,
)

logger = logging.getLogger("radixserve.kv_tier")

_TEMP_SUFFIX = ".tmp"
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
        self._on_store = on_store
        self._lock = threading.Lock()  # guards _index
        self._directory_lock = lock_tier_directory(Path(root), fingerprint.hex())
        self.directory = self._directory_lock.path
        self._index = LRUByteIndex(max_bytes)
        self._rebuild_index()
        self._writes = PageWriteQueue(self._write_page, max_pending_bytes)
        self._is_closed = False

    # ---- KVTier ---------------------------------------------------------

    def contains(self, page_hash: bytes) -> bool:
        with self._lock:
            if page_hash in self._index:
                return True
        return self._writes.pending(page_hash) is not None

    def num_leading_hits(self, page_hashes: Sequence[bytes]) -> int:
        for num_hits, page_hash in enumerate(page_hashes):
            if not self.contains(page_hash):
                return num_hits
        return len(page_hashes)

    def store(self, page_hash: bytes, payload) -> bool:
        if memoryview(payload).nbytes != self.page_num_bytes:
            raise ValueError(f"a page of this tier is {self.page_num_bytes} bytes, got {memoryview(payload).nbytes}")
        if self._is_closed or self.file_num_bytes > self._index.max_bytes:
            return False
        with self._lock:
            if page_hash in self._index:
                self._index.touch(page_hash)
                return False
        return self._writes.put(page_hash, payload)

    def load_into(self, page_hash: bytes, out: memoryview) -> bool:
        out = out.cast("B")
        if out.nbytes != self.page_num_bytes:
            raise ValueError(f"a page of this tier is {self.page_num_bytes} bytes, got a buffer of {out.nbytes}")
        pending = self._writes.pending(page_hash)
        if pending is not None:
            out[:] = pending
            return True
        with self._lock:
            if page_hash not in self._index:
                return False
        path = self.directory / page_file_name(page_hash)
        try:
            with open(path, "rb") as file:
                header = file.read(HEADER_NUM_BYTES)
                num_read = file.readinto(out)
                is_longer = file.read(1) != b""
            if num_read != out.nbytes or is_longer:
                raise PageFileError(f"payload of {num_read}{'+' if is_longer else ''} bytes, expected {out.nbytes}")
            check_page_file(header, out, self.fingerprint, page_hash)
        except FileNotFoundError:
            self._forget(page_hash, delete=False)
            return False
        except (OSError, PageFileError) as error:
            logger.warning("KV disk tier: %s is a miss: %s; deleted", path.name, error)
            self._forget(page_hash, delete=True)
            return False
        with self._lock:
            self._index.touch(page_hash)
        try:
            os.utime(path)  # its mtime is its last use, for the LRU order after a restart
        except OSError:
            pass  # evicted by the writer meanwhile: the payload read is still whole and checked
        return True

    def stats(self) -> KVTierStats:
        with self._lock:
            num_pages, num_bytes = len(self._index), self._index.num_bytes
        return KVTierStats(num_pages=num_pages, num_bytes=num_bytes, max_bytes=self._index.max_bytes,
                           num_dropped_pages=self._writes.num_dropped_pages)

    def flush(self) -> None:
        self._writes.flush()

    def close(self) -> None:
        if self._is_closed:
            return
        self._is_closed = True
        self._writes.close()
        self._directory_lock.release()

    # ---- writer thread --------------------------------------------------

    def _write_page(self, page_hash: bytes, payload: memoryview) -> None:
        started = time.perf_counter()
        with self._lock:
            if page_hash in self._index:
                return
            # Room for the file first (the temporary counts: it becomes the file), so the
            # directory never holds more than max_bytes, not even for a moment.
            evicted = self._index.evict_for(self.file_num_bytes)
            self._index.add(page_hash, self.file_num_bytes)  # reserved; removed again on failure
        for evicted_hash in evicted:
            _unlink_quietly(self.directory / page_file_name(evicted_hash))
        path = self.directory / page_file_name(page_hash)
        temp_path = path.with_name(f".{path.name}.{os.getpid()}{_TEMP_SUFFIX}")
        try:
            with open(temp_path, "wb") as file:
                file.write(page_file_header(self.fingerprint, page_hash, payload))
                file.write(payload)
            os.replace(temp_path, path)
        except BaseException:
            _unlink_quietly(temp_path)
            with self._lock:
                self._index.remove(page_hash)
            raise
        if self._on_store is not None:
            self._on_store(time.perf_counter() - started)

    # ---- start-up -------------------------------------------------------

    def _rebuild_index(self) -> None:
        """The pages in the directory, oldest use first; removes what cannot be a page of ours."""
        found = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.endswith(_TEMP_SUFFIX):
                    _unlink_quietly(Path(entry.path))  # a write cut short by a crash
                    continue
                page_hash = page_hash_of_file_name(entry.name)
                if page_hash is None or not entry.is_file(follow_symlinks=False):
                    continue
                stat = entry.stat(follow_symlinks=False)
                if stat.st_size != self.file_num_bytes:
                    _unlink_quietly(Path(entry.path))  # truncated, or of another layout
                    continue
                found.append((stat.st_mtime_ns, page_hash))
        found.sort()
        for _, page_hash in found:
            self._index.add(page_hash, self.file_num_bytes)
        # The bound may be lower than when these files were written.
        for page_hash in self._index.evict_for(0):
            _unlink_quietly(self.directory / page_file_name(page_hash))

    def _forget(self, page_hash: bytes, delete: bool) -> None:
        with self._lock:
            self._index.remove(page_hash)
        if delete:
            _unlink_quietly(self.directory / page_file_name(page_hash))


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass

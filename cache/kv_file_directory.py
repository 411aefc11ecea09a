"""KV files of one kind in one directory, by 16-byte key: the restart-safe core of every disk tier.

The disk tier's pages (cache/disk_tier.py) and the document store's spans on disk
(cache/document_disk.py) are each one of these:
  - A file is written by the background writer (cache/disk_tier_writer.py) to a temporary name in
    the same directory and renamed into place, so `<key hex><suffix>` is always a complete write.
  - Every file carries the tier's fingerprint, its key and a checksum (cache/page_file.py), checked
    on every read: a torn, truncated, corrupt or foreign file is a miss, and deleted.
  - The index is rebuilt at start from the directory (names and sizes only, no reads), in last-use
    order by mtime (a read bumps it); stale temporaries of a killed process are removed.
  - Bounded: the files (temporaries included) never take more than ``max_bytes``; before a file is
    written, the least recently used are deleted to make room.

The directory must be one no other process writes in: its owner holds the lock of it or of a
directory above it (cache/disk_tier_lock.py). Thread-safe: any thread reads and queues; the
writer thread writes and deletes.
"""

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from cache.disk_tier_index import LRUByteIndex
from cache.disk_tier_writer import PageWriteQueue
from cache.page_file import (
    HEADER_NUM_BYTES,
    KVFileKind,
    PageFileError,
    check_page_file,
    page_file_header,
    page_file_name,
    page_file_num_bytes,
    page_hash_of_file_name,
)

logger = logging.getLogger("radixserve.kv_tier")

_TEMP_SUFFIX = ".tmp"


class KVFileStats(NamedTuple):
    num_files: int  # written, or queued to be written
    num_bytes: int  # their file sizes
    max_bytes: int
    num_dropped: int  # writes refused (queue full) or failed


class KVFileDirectory:
    """``payload_num_bytes``: the size of every payload (pages), or None for payloads of any size
    (document spans). ``on_store(seconds)`` (optional) runs on the writer thread after each file."""

    def __init__(self, directory: Path, fingerprint: bytes, kind: KVFileKind, max_bytes: int,
                 max_pending_bytes: int, payload_num_bytes: int | None = None,
                 on_store: Callable[[float], None] | None = None, thread_name: str = "radixserve-kv-disk-writer"):
        if payload_num_bytes is not None and payload_num_bytes <= 0:
            raise ValueError(f"payload_num_bytes must be positive, got {payload_num_bytes}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fingerprint = fingerprint
        self.kind = kind
        self.payload_num_bytes = payload_num_bytes
        self._on_store = on_store
        self._lock = threading.Lock()  # guards _index
        self._index = LRUByteIndex(max_bytes)
        self._rebuild_index()
        self._writes = PageWriteQueue(self._write, max_pending_bytes, thread_name)
        self._is_closed = False

    @property
    def max_bytes(self) -> int:
        return self._index.max_bytes

    def contains(self, key: bytes) -> bool:
        with self._lock:
            if key in self._index:
                return True
        return self._writes.pending(key) is not None

    def put(self, key: bytes, payload) -> bool:
        """Queue ``payload`` (a buffer the directory takes over) to be written under ``key``. False
        when it is not taken: held already (then marked used), queued, the queue is full, too big."""
        payload_num_bytes = memoryview(payload).nbytes
        if self.payload_num_bytes is not None and payload_num_bytes != self.payload_num_bytes:
            raise ValueError(f"a {self.kind.what} of this tier is {self.payload_num_bytes} bytes, "
                             f"got {payload_num_bytes}")
        if self._is_closed or page_file_num_bytes(payload_num_bytes) > self._index.max_bytes:
            return False
        with self._lock:
            if key in self._index:
                self._index.touch(key)
                return False
        return self._writes.put(key, payload)

    def read(self, key: bytes, out: memoryview | None = None) -> memoryview | None:
        """The payload of ``key``, checked, and mark it used; None (a miss) when missing or damaged
        (a damaged file is deleted). Read into ``out`` (its payload's size) when given, else into a
        new writable buffer."""
        pending = self._writes.pending(key)
        if pending is not None:
            if out is None:
                return memoryview(bytearray(pending))
            out[:] = pending
            return out
        with self._lock:
            if key not in self._index:
                return None
        path = self.directory / page_file_name(key, self.kind)
        try:
            with open(path, "rb") as file:
                header = file.read(HEADER_NUM_BYTES)
                if out is None:
                    out = memoryview(bytearray(max(0, os.fstat(file.fileno()).st_size - HEADER_NUM_BYTES)))
                num_read = file.readinto(out)
                is_longer = file.read(1) != b""
            if num_read != out.nbytes or is_longer:
                raise PageFileError(f"payload of {num_read}{'+' if is_longer else ''} bytes, expected {out.nbytes}")
            check_page_file(header, out, self.fingerprint, key, self.kind)
        except FileNotFoundError:
            self._forget(key, delete=False)
            return None
        except (OSError, PageFileError) as error:
            logger.warning("KV disk tier: %s is a miss: %s; deleted", path.name, error)
            self._forget(key, delete=True)
            return None
        with self._lock:
            self._index.touch(key)
        try:
            os.utime(path)  # its mtime is its last use, for the LRU order after a restart
        except OSError:
            pass  # evicted by the writer meanwhile: the payload read is still whole and checked
        return out

    def forget(self, key: bytes) -> None:
        """Delete the file of ``key`` (its contents were found wrong by the reader)."""
        self._forget(key, delete=True)

    def stats(self) -> KVFileStats:
        with self._lock:
            num_files, num_bytes = len(self._index), self._index.num_bytes
        return KVFileStats(num_files, num_bytes, self._index.max_bytes, self._writes.num_dropped_pages)

    def flush(self) -> None:
        self._writes.flush()

    def close(self) -> None:
        """Write what is queued, then stop the writer. Idempotent."""
        if self._is_closed:
            return
        self._is_closed = True
        self._writes.close()

    # ---- writer thread --------------------------------------------------

    def _write(self, key: bytes, payload: memoryview) -> None:
        started = time.perf_counter()
        file_num_bytes = page_file_num_bytes(payload.nbytes)
        with self._lock:
            if key in self._index:
                return
            # Room for the file first (the temporary counts: it becomes the file), so the
            # directory never holds more than max_bytes, not even for a moment.
            evicted = self._index.evict_for(file_num_bytes)
            self._index.add(key, file_num_bytes)  # reserved; removed again on failure
        for evicted_key in evicted:
            _unlink_quietly(self.directory / page_file_name(evicted_key, self.kind))
        path = self.directory / page_file_name(key, self.kind)
        temp_path = path.with_name(f".{path.name}.{os.getpid()}{_TEMP_SUFFIX}")
        try:
            with open(temp_path, "wb") as file:
                file.write(page_file_header(self.fingerprint, key, payload, self.kind))
                file.write(payload)
            os.replace(temp_path, path)
        except BaseException:
            _unlink_quietly(temp_path)
            with self._lock:
                self._index.remove(key)
            raise
        if self._on_store is not None:
            self._on_store(time.perf_counter() - started)

    # ---- start-up -------------------------------------------------------

    def _rebuild_index(self) -> None:
        """The files in the directory, oldest use first; removes what cannot be a file of ours."""
        found = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.endswith(_TEMP_SUFFIX):
                    _unlink_quietly(Path(entry.path))  # a write cut short by a crash
                    continue
                key = page_hash_of_file_name(entry.name, self.kind)
                if key is None or not entry.is_file(follow_symlinks=False):
                    continue
                stat = entry.stat(follow_symlinks=False)
                if not self._is_possible_size(stat.st_size):
                    _unlink_quietly(Path(entry.path))  # truncated, or of another layout
                    continue
                found.append((stat.st_mtime_ns, key, stat.st_size))
        found.sort()
        for _, key, num_bytes in found:
            self._index.add(key, num_bytes)
        # The bound may be lower than when these files were written.
        for key in self._index.evict_for(0):
            _unlink_quietly(self.directory / page_file_name(key, self.kind))

    def _is_possible_size(self, file_num_bytes: int) -> bool:
        if self.payload_num_bytes is None:
            return file_num_bytes > HEADER_NUM_BYTES
        return file_num_bytes == page_file_num_bytes(self.payload_num_bytes)

    def _forget(self, key: bytes, delete: bool) -> None:
        with self._lock:
            self._index.remove(key)
        if delete:
            _unlink_quietly(self.directory / page_file_name(key, self.kind))


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass

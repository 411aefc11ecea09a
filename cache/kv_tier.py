"""The contract of a KV tier below the page pool: pages by chained page hash, as bytes.

A tier never sees tensors: the engine copies a page out of the pool into a buffer and hands
the buffer over (`store`), and gives a buffer to fill when it loads one (`load_into`). Keys are
chained page hashes (cache/page_hash.py), so a key names one exact prefix, cache salt
included, in any process. The disk tier (cache/disk_tier.py) is one; a host-RAM tier for CUDA
would be another with the same contract, put in front of the disk tier by the engine.
"""

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple


class KVTierStats(NamedTuple):
    num_pages: int  # pages the tier holds (written, or queued to be written)
    num_bytes: int  # bytes they take where the tier keeps them (disk: file sizes)
    max_bytes: int  # the tier's bound
    num_dropped_pages: int  # stores refused: the write queue was full, or a write failed


class KVTier(ABC):
    """Thread-safe: the engine thread calls every method; a tier may write in its own thread."""

    page_num_bytes: int  # the size of every page buffer this tier stores and loads

    @abstractmethod
    def contains(self, page_hash: bytes) -> bool:
        """Whether a load of ``page_hash`` may hit. Changes nothing."""

    @abstractmethod
    def num_leading_hits(self, page_hashes: Sequence[bytes]) -> int:
        """How many of ``page_hashes``, from the first, the tier holds (a chain: stops at the
        first it lacks). Changes nothing; a later load may still miss (evicted or corrupt)."""

    @abstractmethod
    def store(self, page_hash: bytes, payload) -> bool:
        """Keep ``payload`` (a buffer of page_num_bytes) under ``page_hash``. The tier takes the
        buffer over: the caller must not change it afterwards. Never blocks on I/O. Returns
        False when the page was not taken (already held, or no room to queue it)."""

    @abstractmethod
    def load_into(self, page_hash: bytes, out: memoryview) -> bool:
        """Fill ``out`` (page_num_bytes, writable) with the page and mark it used. False (a miss)
        when the tier lacks it or what it holds is damaged, which it then forgets."""

    @abstractmethod
    def stats(self) -> KVTierStats: ...

    @abstractmethod
    def flush(self) -> None:
        """Block until every page stored so far is where a new process would find it."""

    @abstractmethod
    def close(self) -> None:
        """Flush and let go of the tier's resources (threads, locks). Idempotent."""

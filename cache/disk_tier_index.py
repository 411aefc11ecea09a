"""Which pages a disk tier holds, how many bytes they take, and which was used least recently.

Plain bookkeeping, no I/O and no lock: the disk tier owns one and guards it with its lock.
"""

from collections import OrderedDict


class LRUByteIndex:
    """page hash -> file bytes, oldest use first. ``num_bytes`` is the sum of the entries."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._num_bytes_by_hash: OrderedDict[bytes, int] = OrderedDict()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._num_bytes_by_hash)

    def __contains__(self, page_hash: bytes) -> bool:
        return page_hash in self._num_bytes_by_hash

    def add(self, page_hash: bytes, num_bytes: int) -> None:
        """Record a page as the most recently used one (replacing an entry of the same hash)."""
        self.remove(page_hash)
        self._num_bytes_by_hash[page_hash] = num_bytes
        self.num_bytes += num_bytes

    def touch(self, page_hash: bytes) -> None:
        """Make a held page the most recently used one."""
        if page_hash in self._num_bytes_by_hash:
            self._num_bytes_by_hash.move_to_end(page_hash)

    def remove(self, page_hash: bytes) -> bool:
        num_bytes = self._num_bytes_by_hash.pop(page_hash, None)
        if num_bytes is None:
            return False
        self.num_bytes -= num_bytes
        return True

    def evict_for(self, num_new_bytes: int) -> list[bytes]:
        """Remove least recently used entries until ``num_new_bytes`` more fit under max_bytes;
        returns the hashes removed, oldest first (their files are the caller's to delete).
        Removes nothing when ``num_new_bytes`` alone exceeds the bound."""
        if num_new_bytes > self.max_bytes:
            return []
        evicted = []
        while self.num_bytes + num_new_bytes > self.max_bytes:
            page_hash, num_bytes = self._num_bytes_by_hash.popitem(last=False)
            self.num_bytes -= num_bytes
            evicted.append(page_hash)
        return evicted

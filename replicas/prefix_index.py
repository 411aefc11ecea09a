"""Per replica, the chained page hashes it is believed to hold.

Two sources, either of which may be stale (a stale entry costs a cache miss on the replica,
never a wrong answer: the replica computes whatever it does not hold):
  - reported: the replica's own set, rebuilt from its radix tree's page events and sent as a
    snapshot with a version (replaced wholesale when a newer version arrives);
  - routed: the page hashes of requests just sent there (SGLang's approximate tree), which
    the replica will hold once it prefilled them; they expire after `routed_ttl_s`, by which
    time a snapshot has long reported the truth.
"""

import time
from collections.abc import Callable, Hashable, Iterable, Sequence

DEFAULT_ROUTED_TTL_S = 30.0


class _ReplicaPages:
    __slots__ = ("reported", "reported_version", "routed")

    def __init__(self):
        self.reported: frozenset[bytes] = frozenset()
        self.reported_version = -1
        self.routed: dict[bytes, float] = {}  # page hash -> expiry (clock seconds)


class PrefixIndex:
    def __init__(self, routed_ttl_s: float = DEFAULT_ROUTED_TTL_S, clock: Callable[[], float] = time.monotonic):
        self.routed_ttl_s = routed_ttl_s
        self._clock = clock
        self._replicas: dict[Hashable, _ReplicaPages] = {}

    @property
    def replica_ids(self) -> list[Hashable]:
        return list(self._replicas)

    def num_pages(self, replica_id: Hashable) -> int:
        pages = self._replicas.get(replica_id)
        return 0 if pages is None else len(pages.reported) + len(pages.routed)

    def apply_snapshot(self, replica_id: Hashable, version: int, page_hashes: Iterable[bytes]) -> bool:
        """The replica's reported set; ignored unless newer than the last one. True if applied."""
        pages = self._replicas.setdefault(replica_id, _ReplicaPages())
        if version <= pages.reported_version:
            return False
        pages.reported = frozenset(page_hashes)
        pages.reported_version = version
        now = self._clock()
        pages.routed = {h: expiry for h, expiry in pages.routed.items() if expiry > now and h not in pages.reported}
        return True

    def record_routed(self, replica_id: Hashable, page_hashes: Sequence[bytes]) -> None:
        pages = self._replicas.setdefault(replica_id, _ReplicaPages())
        expiry = self._clock() + self.routed_ttl_s
        for page_hash in page_hashes:
            if page_hash not in pages.reported:
                pages.routed[page_hash] = expiry

    def drop(self, replica_id: Hashable) -> None:
        """A replica that died or left: it holds nothing any more."""
        self._replicas.pop(replica_id, None)

    def keep_only(self, replica_ids: Iterable[Hashable]) -> None:
        alive = set(replica_ids)
        for replica_id in [r for r in self._replicas if r not in alive]:
            del self._replicas[replica_id]

    def num_leading_pages(self, replica_id: Hashable, page_hashes: Sequence[bytes]) -> int:
        """How many of the request's pages, from the first on, the replica holds (as far as known).
        Chained hashes: page i's hash names the whole prefix up to page i, so the count stops at
        the first page the replica lacks."""
        pages = self._replicas.get(replica_id)
        if pages is None:
            return 0
        reported, routed = pages.reported, pages.routed
        now = None
        num_pages = 0
        for page_hash in page_hashes:
            if page_hash not in reported:
                expiry = routed.get(page_hash)
                if expiry is None:
                    break
                now = self._clock() if now is None else now
                if expiry <= now:
                    break
            num_pages += 1
        return num_pages

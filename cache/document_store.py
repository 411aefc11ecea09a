"""The document KV store: KV of token spans (documents, chunks, pasted passages), computed once
and placed at any position later (engine/document_reuse.py re-rotates K by the position delta).

Separate from the radix tree on purpose: the tree holds only KV computed exactly for the prefix it
is keyed by, while a stored span's KV was computed after some other context and is approximate
wherever it is placed. An entry is keyed by (its token ids, cache salt), so tenants with different
salts never see each other's spans; the model is implicit (one store per engine).

Bounded in bytes, LRU. Ref counts like pages: a request that will copy an entry holds a reference
from planning until the copy, and a referenced entry is never evicted; after every drain no entry
is referenced. The payload (`kv`) is opaque here (the engine keeps (K, V) tensors), so the
bookkeeping is plain Python and is tested without torch. Not thread-safe: the engine loop owns it.

Below it, optionally, a DocumentTier (the disk: engine/document_kv_disk.py over cache/document_disk.py):
every entry inserted is also written there; a lookup that misses memory but hits the tier loads the
entry into memory (LRU, as if inserted) and returns it, to be used exactly as an in-memory hit; an
entry evicted from memory stays in the tier (one the tier lacks, its write dropped, is written then).
`key in store` counts the tier too: a span there costs no compute.
"""

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

DocumentKey = tuple[tuple[int, ...], str | None]  # (the span's token ids, cache salt)


def document_key(token_ids: Sequence[int], cache_salt: str | None) -> DocumentKey:
    return tuple(token_ids), cache_salt


@dataclass(eq=False)
class DocumentEntry:
    key: DocumentKey
    kv: object  # the KV of the span's tokens, as the engine stores it
    num_bytes: int
    position: int  # the position its first token was computed at (re-rotation starts from it)
    # The stored span it was computed right after in the same prompt, or None: when the two appear
    # together in that order again, the boundary between them needs no recompute.
    predecessor: DocumentKey | None = None
    ref_count: int = 0
    # The tokens right before the span when it was computed (a precomputed span's context tail: the
    # documents block's markup), whose KV rows come first in `kv`, at positions position - len .. - 1.
    # Where a prompt has the same tokens before the span, they are placed with it.
    lead_ids: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.key[0])


class LoadedDocument(NamedTuple):
    kv: object
    num_bytes: int
    position: int
    predecessor: DocumentKey | None
    lead_ids: tuple[int, ...] = ()


class DocumentTier(ABC):
    """Where entries live on below the store's memory. Called from the store's thread only."""

    @abstractmethod
    def contains(self, key: DocumentKey) -> bool:
        """Whether a load of `key` may hit. Changes nothing."""

    @abstractmethod
    def store(self, key: DocumentKey, kv: object, position: int, predecessor: DocumentKey | None,
              lead_ids: Sequence[int] = ()) -> bool:
        """Keep a copy of the entry (its KV has len(lead_ids) lead rows before the span's) (the tier copies what it needs; never blocks on I/O). False when
        not taken (held already, no room to queue it)."""

    @abstractmethod
    def load(self, key: DocumentKey) -> LoadedDocument | None:
        """The entry of `key`, or None (a miss) when the tier lacks it or what it holds is damaged."""


class DocumentKVStore:
    def __init__(self, max_bytes: int, tier: DocumentTier | None = None):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self.tier = tier
        self._entries: OrderedDict[DocumentKey, DocumentEntry] = OrderedDict()  # least recently used first
        self.num_bytes = 0
        self.num_evicted_entries = 0
        # Lookups that missed memory: served by the tier (loaded into memory) / missed it too.
        self.num_tier_hits = 0
        self.num_tier_misses = 0

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    @property
    def num_referenced_entries(self) -> int:
        return sum(1 for entry in self._entries.values() if entry.ref_count)

    def __contains__(self, key: DocumentKey) -> bool:
        """In memory or in the tier (a later lookup may still miss: evicted or damaged there)."""
        return key in self._entries or (self.tier is not None and self.tier.contains(key))

    def in_memory(self, key: DocumentKey) -> bool:
        return key in self._entries

    def entries(self) -> Iterator[DocumentEntry]:
        """Every entry, least recently used first (inspection; do not mutate)."""
        return iter(list(self._entries.values()))

    def lookup(self, key: DocumentKey) -> DocumentEntry | None:
        """The entry of `key`, marked most recently used; takes no reference. On a memory miss, the
        tier's copy is loaded into memory (evicting as an insert does) and returned; None when the
        tier lacks it too, or it does not fit. A later lookup's load may evict this entry unless
        it is acquired."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry
        if self.tier is None:
            return None
        loaded = self.tier.load(key)
        if loaded is None:
            self.num_tier_misses += 1
            return None
        entry = self._add(key, loaded.kv, loaded.num_bytes, loaded.position, loaded.predecessor, loaded.lead_ids)
        if entry is not None:
            self.num_tier_hits += 1
        return entry

    def acquire(self, entry: DocumentEntry) -> None:
        """One more reference: `entry` stays until released. It must be in the store."""
        if self._entries.get(entry.key) is not entry:
            raise ValueError("acquire of an entry that is not in the store")
        entry.ref_count += 1

    def release(self, entry: DocumentEntry) -> None:
        """Undo one acquire. Raises, changing nothing, when `entry` holds no reference."""
        if entry.ref_count <= 0:
            raise ValueError(f"release of an unreferenced document entry ({entry.num_tokens} tokens)")
        entry.ref_count -= 1

    def insert(self, key: DocumentKey, kv: object, num_bytes: int, position: int,
               predecessor: DocumentKey | None = None, lead_ids: Sequence[int] = ()) -> DocumentEntry | None:
        """Store a span's KV, evicting least recently used unreferenced entries to make room.
        Returns the entry (the one already stored under `key`, if any, which is kept as it is),
        or None when it cannot fit (larger than the store, or the rest is referenced). A new entry
        goes to the tier too, whether or not it fits in memory."""
        existing = self._entries.get(key)
        if existing is not None:
            self._entries.move_to_end(key)
            return existing
        if not key[0]:
            return None
        if self.tier is not None and not self.tier.contains(key):
            self.tier.store(key, kv, position, predecessor, lead_ids)
        return self._add(key, kv, num_bytes, position, predecessor, lead_ids)

    def _add(self, key: DocumentKey, kv: object, num_bytes: int, position: int,
             predecessor: DocumentKey | None, lead_ids: Sequence[int] = ()) -> DocumentEntry | None:
        if num_bytes > self.max_bytes or not self._make_room(num_bytes):
            return None
        entry = DocumentEntry(key, kv, num_bytes, position, predecessor, lead_ids=tuple(lead_ids))
        self._entries[key] = entry
        self.num_bytes += num_bytes
        return entry

    def _make_room(self, num_bytes: int) -> bool:
        """Evict unreferenced entries, LRU first, until num_bytes more fit; False (evicting
        nothing) when they cannot."""
        room = self.max_bytes - self.num_bytes
        if room >= num_bytes:
            return True
        evictable = [entry for entry in self._entries.values() if not entry.ref_count]
        if room + sum(entry.num_bytes for entry in evictable) < num_bytes:
            return False
        for entry in evictable:
            if self.max_bytes - self.num_bytes >= num_bytes:
                break
            del self._entries[entry.key]
            self.num_bytes -= entry.num_bytes
            self.num_evicted_entries += 1
            if self.tier is not None and not self.tier.contains(entry.key):  # its write was dropped
                self.tier.store(entry.key, entry.kv, entry.position, entry.predecessor, entry.lead_ids)
        return True

    def clear(self) -> None:
        """Drop every entry from memory (the tier keeps its copies). Nothing may be referenced."""
        if self.num_referenced_entries:
            raise ValueError(f"clear with {self.num_referenced_entries} referenced entries")
        self._entries.clear()
        self.num_bytes = 0

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
"""

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

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


class DocumentKVStore:
    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[DocumentKey, DocumentEntry] = OrderedDict()  # least recently used first
        self.num_bytes = 0
        self.num_evicted_entries = 0

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    @property
    def num_referenced_entries(self) -> int:
        return sum(1 for entry in self._entries.values() if entry.ref_count)

    def __contains__(self, key: DocumentKey) -> bool:
        return key in self._entries

    def entries(self) -> Iterator[DocumentEntry]:
        """Every entry, least recently used first (inspection; do not mutate)."""
        return iter(list(self._entries.values()))

    def lookup(self, key: DocumentKey) -> DocumentEntry | None:
        """The entry of `key`, marked most recently used; takes no reference."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
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
        or None when it cannot fit (larger than the store, or the rest is referenced)."""
        existing = self.lookup(key)
        if existing is not None:
            return existing
        if num_bytes > self.max_bytes or not key[0]:
            return None
        if not self._make_room(num_bytes):
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
        return True

    def clear(self) -> None:
        """Drop every entry. Nothing may be referenced."""
        if self.num_referenced_entries:
            raise ValueError(f"clear with {self.num_referenced_entries} referenced entries")
        self._entries.clear()
        self.num_bytes = 0

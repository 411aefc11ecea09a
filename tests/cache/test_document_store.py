"""DocumentKVStore on its own: keys (tokens, salt), bytes bound, LRU, references block eviction."""

import random

import pytest

from cache.document_store import DocumentKVStore, document_key


def _key(first: int, salt=None, length: int = 4):
    return document_key(range(first, first + length), salt)


def test_lookup_finds_only_the_same_tokens_and_salt():
    store = DocumentKVStore(100)
    entry = store.insert(_key(0), "kv", 10, position=7)
    assert store.lookup(_key(0)) is entry and entry.position == 7 and entry.num_tokens == 4
    assert store.lookup(_key(0, salt="tenant")) is None
    assert store.lookup(_key(1)) is None
    assert store.lookup(document_key([0, 1, 2], None)) is None  # a prefix of a span is another key


def test_a_stored_key_keeps_its_first_entry():
    store = DocumentKVStore(100)
    first = store.insert(_key(0), "first", 10, position=0)
    assert store.insert(_key(0), "second", 10, position=50) is first
    assert first.kv == "first" and store.num_bytes == 10 and store.num_entries == 1


def test_records_the_predecessor():
    store = DocumentKVStore(100)
    store.insert(_key(0), "a", 10, position=0)
    second = store.insert(_key(4), "b", 10, position=4, predecessor=_key(0))
    assert second.predecessor == _key(0)


def test_bytes_bound_evicts_least_recently_used():
    store = DocumentKVStore(30)
    for first in (0, 10, 20):
        store.insert(_key(first), first, 10, position=first)
    store.lookup(_key(0))  # now the most recently used
    store.insert(_key(30), 30, 10, position=0)
    assert _key(10) not in store and _key(0) in store and store.num_bytes == 30
    assert store.num_evicted_entries == 1


def test_a_referenced_entry_is_never_evicted():
    store = DocumentKVStore(20)
    held = store.insert(_key(0), 0, 10, position=0)
    store.acquire(held)
    store.insert(_key(10), 10, 10, position=0)
    assert store.insert(_key(20), 20, 15, position=0) is None  # only 10 bytes are evictable
    assert _key(10) in store  # a refused insert evicts nothing
    assert store.insert(_key(20), 20, 10, position=0) is not None
    assert _key(0) in store and _key(10) not in store
    store.release(held)
    assert store.num_referenced_entries == 0


def test_too_large_or_empty_is_refused_and_bad_refs_raise():
    store = DocumentKVStore(10)
    assert store.insert(_key(0), 0, 11, position=0) is None
    assert store.insert(document_key([], None), 0, 1, position=0) is None
    entry = store.insert(_key(0), 0, 10, position=0)
    with pytest.raises(ValueError, match="unreferenced"):
        store.release(entry)
    store.insert(_key(5), 0, 10, position=0)  # evicts entry
    with pytest.raises(ValueError, match="not in the store"):
        store.acquire(entry)


def test_random_use_keeps_bytes_and_references_balanced():
    rng = random.Random(0)
    store = DocumentKVStore(200)
    held = []
    for _ in range(2000):
        action = rng.random()
        if action < 0.5:
            entry = store.insert(_key(rng.randrange(40), rng.choice([None, "s"])), None, rng.randrange(1, 60), 0)
            if entry is not None and rng.random() < 0.3:
                store.acquire(entry)
                held.append(entry)
        elif held:
            store.release(held.pop(rng.randrange(len(held))))
        assert store.num_bytes == sum(e.num_bytes for e in store.entries()) <= store.max_bytes
        assert all(e.key in store for e in held)  # referenced entries survive
    for entry in held:
        store.release(entry)
    assert store.num_referenced_entries == 0
    store.clear()
    assert store.num_bytes == 0 and store.num_entries == 0

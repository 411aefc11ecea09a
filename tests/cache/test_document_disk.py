"""The document store's spans on disk (bytes only): round trip and restart, salts apart, damage is a
miss and goes away, the byte bound, and DocumentKVStore over it (memory misses load from disk,
memory eviction keeps the disk copy)."""

from pathlib import Path

from cache.disk_tier_lock import lock_tier_directory
from cache.document_disk import DocumentDisk, document_key_hash
from cache.document_store import DocumentKVStore, DocumentTier, LoadedDocument, document_key
from cache.page_file import SPAN_FILE, page_file_name

FINGERPRINT = bytes.fromhex("00112233445566778899aabbccddeeff")
KV_BYTES = 1000  # per span, in these tests


def _key(first: int, salt=None, length: int = 8):
    return document_key(range(first, first + length), salt)


def _kv(index: int) -> bytes:
    return bytes([index % 251]) * KV_BYTES


def _disk(directory: Path, max_bytes: int = 1 << 20, fingerprint: bytes = FINGERPRINT) -> DocumentDisk:
    return DocumentDisk(directory, fingerprint, max_bytes)


def _path(disk: DocumentDisk, key) -> Path:
    return disk.directory / page_file_name(document_key_hash(key), SPAN_FILE)


class BytesTier(DocumentTier):
    """The store's tier over a DocumentDisk, with plain bytes as the KV (the engine's is tensors)."""

    def __init__(self, disk: DocumentDisk):
        self.disk = disk

    def contains(self, key):
        return self.disk.contains(key)

    def store(self, key, kv, position, predecessor, lead_ids=()):
        return self.disk.put(key, position, predecessor, [kv], lead_ids)

    def load(self, key):
        stored = self.disk.read(key)
        if stored is None:
            return None
        return LoadedDocument(bytes(stored.kv), stored.kv.nbytes, stored.position, stored.predecessor, stored.lead_ids)


def test_a_span_loads_back_with_its_position_and_predecessor_in_this_process_and_after_a_restart(tmp_path):
    disk = _disk(tmp_path)
    assert disk.put(_key(0), 5, None, [_kv(0)])
    assert disk.put(_key(8), 13, _key(0), [_kv(1)[:400], _kv(1)[400:]])  # parts, one after the other
    assert disk.contains(_key(8))  # from the write queue or from disk
    disk.flush()
    assert not disk.put(_key(0), 5, None, [_kv(0)])  # held already
    disk.close()

    again = _disk(tmp_path)
    assert again.stats().num_files == 2
    first, second = again.read(_key(0)), again.read(_key(8))
    assert (first.position, first.predecessor, bytes(first.kv)) == (5, None, _kv(0))
    assert (second.position, second.predecessor, bytes(second.kv)) == (13, _key(0), _kv(1))
    assert again.read(_key(1)) is None
    again.close()


def test_salts_name_different_files_and_never_read_each_other(tmp_path):
    disk = _disk(tmp_path)
    disk.put(_key(0, salt="tenant-a"), 0, None, [_kv(1)])
    disk.close()
    again = _disk(tmp_path)
    assert again.read(_key(0, salt="tenant-b")) is None and again.read(_key(0)) is None
    assert bytes(again.read(_key(0, salt="tenant-a")).kv) == _kv(1)
    assert document_key_hash(_key(0, salt=None)) != document_key_hash(_key(0, salt=""))
    again.close()


def test_damaged_truncated_foreign_and_swapped_files_are_misses_and_go_away(tmp_path):
    keys = [_key(10 * i) for i in range(4)]
    disk = _disk(tmp_path)
    for index, key in enumerate(keys):
        disk.put(key, index, None, [_kv(index)])
    disk.close()
    corrupt = _path(disk, keys[0])
    data = bytearray(corrupt.read_bytes())
    data[-7] ^= 0xFF
    corrupt.write_bytes(data)
    _path(disk, keys[1]).write_bytes(b"too short")
    other = _disk(tmp_path / "other", fingerprint=bytes(16))  # another model or layout
    other.put(keys[2], 2, None, [_kv(2)])
    other.close()
    _path(disk, keys[2]).write_bytes(_path(other, keys[2]).read_bytes())
    _path(disk, keys[3]).write_bytes(_path(disk, keys[0]).read_bytes())  # another span's file under this name
    (tmp_path / f".{_path(disk, keys[0]).name}.123.tmp").write_bytes(b"half a span")  # a killed write

    again = _disk(tmp_path)
    assert not _path(disk, keys[1]).exists() and not list(tmp_path.glob("*.tmp"))  # removed at start
    assert [again.read(key) for key in keys] == [None] * 4
    assert again.stats().num_files == 0 and not list(tmp_path.glob("*.kvspan"))
    again.close()


def test_the_files_never_exceed_the_bound_and_the_recently_used_stay(tmp_path):
    file_bytes = _disk_file_bytes(tmp_path / "probe")
    max_bytes = 3 * file_bytes + 10
    disk = _disk(tmp_path, max_bytes)
    for index in range(3):
        disk.put(_key(10 * index), 0, None, [_kv(index)])
    disk.flush()
    assert disk.read(_key(0)) is not None  # used: the newest now
    for index in range(3, 6):
        disk.put(_key(10 * index), 0, None, [_kv(index)])
        disk.flush()
        assert sum(path.stat().st_size for path in tmp_path.glob("*.kvspan")) <= max_bytes
    assert {path.name for path in tmp_path.glob("*.kvspan")} == {_path(disk, _key(10 * i)).name for i in (3, 4, 5)}
    disk.close()
    smaller = _disk(tmp_path, 2 * file_bytes)  # a lower bound at restart trims the oldest
    assert smaller.stats().num_files == 2 and smaller.read(_key(30)) is None
    smaller.close()


def _disk_file_bytes(directory: Path) -> int:
    disk = _disk(directory)
    disk.put(_key(0), 0, None, [_kv(0)])
    disk.close()
    return disk.stats().num_bytes


def test_the_store_writes_through_loads_memory_misses_and_keeps_the_disk_copy_of_evicted_entries(tmp_path):
    tier = BytesTier(_disk(tmp_path))
    store = DocumentKVStore(2 * KV_BYTES, tier)
    for index in range(3):
        store.insert(_key(10 * index), _kv(index), KV_BYTES, position=index, predecessor=None)
    assert store.num_entries == 2 and not store.in_memory(_key(0))  # evicted from memory...
    assert _key(0) in store  # ...but still stored: on disk
    entry = store.lookup(_key(0))  # loaded back into memory, evicting the least recently used
    assert (entry.kv, entry.position, store.num_tier_hits) == (_kv(0), 0, 1)
    assert store.in_memory(_key(0)) and not store.in_memory(_key(10))
    assert store.lookup(_key(99)) is None and store.num_tier_misses == 1
    tier.disk.close()

    restarted = DocumentKVStore(2 * KV_BYTES, BytesTier(_disk(tmp_path)))  # a new process, an empty memory
    assert restarted.num_entries == 0 and all(_key(10 * i) in restarted for i in range(3))
    entry = restarted.lookup(_key(20))
    assert (entry.kv, entry.position) == (_kv(2), 2) and restarted.num_bytes == KV_BYTES
    restarted.tier.disk.close()


def test_a_load_never_evicts_a_referenced_entry_and_misses_when_nothing_else_can_go(tmp_path):
    tier = BytesTier(_disk(tmp_path))
    store = DocumentKVStore(KV_BYTES, tier)
    store.insert(_key(0), _kv(0), KV_BYTES, position=0)
    store.insert(_key(10), _kv(1), KV_BYTES, position=0)  # evicts _key(0) from memory
    held = store.lookup(_key(10))
    store.acquire(held)
    assert store.lookup(_key(0)) is None  # on disk, but no room beside the referenced entry
    assert store.in_memory(_key(10))
    store.release(held)
    assert store.lookup(_key(0)).kv == _kv(0)
    tier.disk.close()


def test_an_entry_whose_write_was_dropped_is_written_when_memory_evicts_it(tmp_path):
    disk = DocumentDisk(tmp_path, FINGERPRINT, 1 << 20, max_pending_bytes=1)  # every queued write is dropped
    store = DocumentKVStore(KV_BYTES, BytesTier(disk))
    store.insert(_key(0), _kv(0), KV_BYTES, position=0)
    assert not disk.contains(_key(0)) and disk.stats().num_dropped == 1
    disk._files._writes.max_pending_bytes = 1 << 20  # the queue has room again
    store.insert(_key(10), _kv(1), KV_BYTES, position=0)  # evicts _key(0): written now
    disk.flush()
    assert disk.contains(_key(0)) and bytes(disk.read(_key(0)).kv) == _kv(0)
    disk.close()


def test_the_documents_folder_sits_in_a_locked_tier_directory_without_disturbing_its_pages(tmp_path):
    from cache.disk_tier import DiskTier

    tier = DiskTier(tmp_path, FINGERPRINT, 4096, 1 << 20)
    disk = _disk(tier.directory / "documents")
    disk.put(_key(0), 0, None, [_kv(0)])
    disk.close()
    tier.close()
    again = DiskTier(tmp_path, FINGERPRINT, 4096, 1 << 20)  # the page index ignores the subfolder
    assert again.stats().num_pages == 0 and (again.directory / "documents").is_dir()
    second = lock_tier_directory(tmp_path, FINGERPRINT.hex())  # a second server gets its own directory
    assert second.path != again.directory
    second.release()
    documents = _disk(again.directory / "documents")
    assert documents.read(_key(0)) is not None
    documents.close()
    again.close()


def test_a_span_keeps_its_lead_tokens_on_disk(tmp_path):
    disk = _disk(tmp_path)
    assert disk.put(_key(0), 5, None, [_kv(0)], lead_ids=(7, 8, 9))
    disk.close()
    again = _disk(tmp_path)  # after a restart
    stored = again.read(_key(0))
    assert stored.lead_ids == (7, 8, 9) and stored.position == 5 and bytes(stored.kv) == _kv(0)
    again.close()

"""The disk tier on plain bytes: store, load, restart, bound, damage, locking, SIGKILL."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cache.disk_tier import DiskTier
from cache.page_file import page_file_name, page_file_num_bytes
from cache.page_hash import hash_pages

FINGERPRINT = bytes.fromhex("00112233445566778899aabbccddeeff")
PAGE_NUM_BYTES = 4096
FILE_NUM_BYTES = page_file_num_bytes(PAGE_NUM_BYTES)


def _hashes(num_pages: int, salt: str | None = None, first_token: int = 0) -> list[bytes]:
    tokens = list(range(first_token, first_token + 4 * num_pages))
    return hash_pages(b"", tokens, 4, salt)


def _payload(index: int) -> bytes:
    return bytes([index % 251]) * PAGE_NUM_BYTES


def _load(tier: DiskTier, page_hash: bytes) -> bytes | None:
    out = bytearray(PAGE_NUM_BYTES)
    return bytes(out) if tier.load_into(page_hash, memoryview(out)) else None


def _tier(root: Path, max_bytes: int = 1 << 20, fingerprint: bytes = FINGERPRINT) -> DiskTier:
    return DiskTier(root, fingerprint, PAGE_NUM_BYTES, max_bytes)


def _files(tier: DiskTier) -> list[Path]:
    return sorted(path for path in tier.directory.iterdir() if path.name != ".lock")


def test_stored_pages_load_back_in_this_process_and_after_a_restart(tmp_path):
    hashes = _hashes(5)
    tier = _tier(tmp_path)
    for index, page_hash in enumerate(hashes):
        assert tier.store(page_hash, _payload(index))
    assert tier.num_leading_hits(hashes) == 5  # served from the write queue or from disk
    assert _load(tier, hashes[3]) == _payload(3)
    tier.close()

    again = _tier(tmp_path)
    assert again.directory == tier.directory
    assert again.stats().num_pages == 5 and again.stats().num_bytes == 5 * FILE_NUM_BYTES
    assert [_load(again, page_hash) for page_hash in hashes] == [_payload(i) for i in range(5)]
    assert again.num_leading_hits(hashes[:2] + _hashes(1, first_token=99) + hashes[2:]) == 2  # a chain
    assert not again.store(hashes[0], _payload(0))  # held already
    again.close()


def test_the_tier_never_exceeds_its_bound_and_keeps_the_recently_used(tmp_path):
    max_bytes = 4 * FILE_NUM_BYTES + 100
    tier = _tier(tmp_path, max_bytes)
    hashes = _hashes(10)
    for index, page_hash in enumerate(hashes[:4]):
        tier.store(page_hash, _payload(index))
    tier.flush()
    assert _load(tier, hashes[0]) == _payload(0)  # used: the newest now
    for index, page_hash in enumerate(hashes[4:], start=4):
        tier.store(page_hash, _payload(index))
        tier.flush()
        assert sum(path.stat().st_size for path in _files(tier)) <= max_bytes
    assert tier.stats().num_bytes <= max_bytes
    assert {path.name for path in _files(tier)} == {page_file_name(h) for h in hashes[6:]}
    tier.close()
    smaller = _tier(tmp_path, 2 * FILE_NUM_BYTES)  # a lower bound at restart trims the oldest
    assert {path.name for path in _files(smaller)} == {page_file_name(h) for h in hashes[8:]}
    smaller.close()


def test_damaged_truncated_and_foreign_files_are_misses_and_go_away(tmp_path):
    hashes = _hashes(4)
    tier = _tier(tmp_path)
    for index, page_hash in enumerate(hashes):
        tier.store(page_hash, _payload(index))
    tier.close()
    directory = tier.directory
    corrupt = directory / page_file_name(hashes[0])
    data = bytearray(corrupt.read_bytes())
    data[-7] ^= 0xFF
    corrupt.write_bytes(data)
    truncated = directory / page_file_name(hashes[1])
    truncated.write_bytes(truncated.read_bytes()[:-10])
    # A file of another fingerprint under our name, and a page file swapped under another key.
    other = _tier(tmp_path / "other", fingerprint=bytes(16))
    other.store(hashes[2], _payload(2))
    other.close()
    (directory / page_file_name(hashes[2])).write_bytes((other.directory / page_file_name(hashes[2])).read_bytes())
    (directory / page_file_name(hashes[3])).write_bytes((directory / page_file_name(hashes[0])).read_bytes())
    (directory / f".{page_file_name(hashes[0])}.123.tmp").write_bytes(b"half a page")  # a killed write

    again = _tier(tmp_path)
    assert not truncated.exists() and not list(directory.glob("*.tmp"))  # removed at start (size, temp)
    assert [_load(again, page_hash) for page_hash in hashes] == [None] * 4
    assert again.stats().num_pages == 0 and _files(again) == []
    again.close()


def test_a_second_process_on_the_same_root_gets_its_own_directory(tmp_path):
    first = _tier(tmp_path)
    second = _tier(tmp_path)
    assert first.directory != second.directory
    assert second.directory.name == first.directory.name + "-2"
    second.close()
    first.close()
    assert _tier(tmp_path).directory == first.directory  # the lock went with the close


def test_stores_beyond_the_queue_bound_are_dropped_not_blocking(tmp_path):
    tier = DiskTier(tmp_path, FINGERPRINT, PAGE_NUM_BYTES, 1 << 30, max_pending_bytes=PAGE_NUM_BYTES)
    results = [tier.store(page_hash, _payload(i)) for i, page_hash in enumerate(_hashes(50))]
    tier.flush()
    assert results[0] and tier.stats().num_dropped_pages == results.count(False)
    assert tier.stats().num_pages == results.count(True)
    tier.close()


_BURST = """
import sys
from pathlib import Path
from cache.disk_tier import DiskTier
from cache.page_hash import hash_pages
tier = DiskTier(Path(sys.argv[1]), bytes.fromhex(sys.argv[2]), {page_num_bytes}, {max_bytes})
print("ready", flush=True)
index = 0
while True:
    page_hash = hash_pages(b"", [index] * 4, 4, None)[0]
    tier.store(page_hash, bytes([index % 251]) * {page_num_bytes})
    index += 1
    if index % 64 == 0:
        tier.flush()
"""


def test_sigkill_during_a_burst_of_writes_leaves_a_tier_that_loads(tmp_path):
    max_bytes = 200 * FILE_NUM_BYTES  # small: the burst also deletes while it writes
    script = _BURST.format(page_num_bytes=PAGE_NUM_BYTES, max_bytes=max_bytes)
    process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path), FINGERPRINT.hex()],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    directory = tmp_path / FINGERPRINT.hex()
    while len(list(directory.glob("*.kvpage"))) < 300 // 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()

    tier = _tier(tmp_path, max_bytes)
    assert tier.directory == directory  # the killed process's lock is gone
    assert 0 < tier.stats().num_pages <= 200
    for path in _files(tier):
        page_hash = bytes.fromhex(path.name.removesuffix(".kvpage"))
        out = _load(tier, page_hash)
        assert out is not None and len(set(out)) == 1  # whole and checked: one byte value throughout
    tier.close()


def test_a_page_of_the_wrong_size_is_refused(tmp_path):
    tier = _tier(tmp_path)
    with pytest.raises(ValueError):
        tier.store(_hashes(1)[0], b"short")
    tier.close()

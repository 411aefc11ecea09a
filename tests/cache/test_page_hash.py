import hashlib
import os
import struct
import subprocess
import sys

from cache import PAGE_HASH_NUM_BYTES, ROOT_PAGE_HASH, hash_page, hash_pages


def spec_hash(parent_hash: bytes, page_token_ids: list[int], key_bytes: bytes) -> bytes:
    """The documented encoding, written out independently of cache.page_hash."""
    payload = parent_hash + key_bytes + b"".join(struct.pack("<I", t) for t in page_token_ids)
    return hashlib.blake2b(payload, digest_size=16).digest()


def test_hash_follows_documented_encoding():
    first = spec_hash(b"", [1, 2], b"\x00")
    second = spec_hash(first, [3, 4], b"\x00")
    assert hash_pages(ROOT_PAGE_HASH, [1, 2, 3, 4, 5], 2, None) == [first, second]
    salted = spec_hash(b"", [1, 2], b"\x01" + struct.pack("<I", 3) + b"abc")
    assert hash_page(ROOT_PAGE_HASH, [1, 2], "abc") == salted
    assert len(first) == PAGE_HASH_NUM_BYTES


def test_chaining_makes_hash_depend_on_the_whole_prefix():
    assert hash_page(hash_page(b"", [1], None), [2], None) != hash_page(
        hash_page(b"", [3], None), [2], None
    )


def test_cache_salts_are_distinct_namespaces():
    hashes = {hash_page(b"", [7, 8], key) for key in (None, "", "a", "\x00")}
    assert len(hashes) == 4


def test_hash_is_the_same_in_another_process():
    code = "from cache import hash_pages; print(hash_pages(b'', [5, 6, 7, 8], 2, 't')[-1].hex())"
    outputs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(result.stdout.strip())
    assert outputs == {hash_pages(b"", [5, 6, 7, 8], 2, "t")[-1].hex()}

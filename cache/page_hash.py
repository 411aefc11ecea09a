"""Chained page hashes: a name for a cached prefix that is the same in every process.

    hash_i = blake2b(hash_{i-1} || cache_salt || tokens of page i), 16-byte digest,
    with hash_{-1} = ROOT_PAGE_HASH = b""

so equal hashes mean equal (cache_salt, prefix up to and including that page), across
processes and replicas (routing, a host or disk tier). Python's hash() is salted per process
and is never used. The byte encoding is fixed:

    cache_salt  None -> b"\\x00"; a str -> b"\\x01" + uint32 LE byte length + UTF-8 bytes
               (tagged and length-prefixed, so None, "" and any key stay distinct and no key
               can run into the tokens); a DerivedSalt -> b"\\x02" + its salt's encoding
    tokens     each id as uint32 little-endian
"""

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

PAGE_HASH_NUM_BYTES = 16
ROOT_PAGE_HASH = b""


@dataclass(frozen=True)
class DerivedSalt:
    """The key of derived KV (document KV placed at a new position, and everything computed
    after it) of tenant `salt`: equal to no str and no None, so a lookup with a plain salt (exact
    KV only) never reaches it, and tenants stay apart as with plain salts."""

    salt: str | None


def encode_cache_salt(cache_salt: "str | None | DerivedSalt") -> bytes:
    if isinstance(cache_salt, DerivedSalt):
        return b"\x02" + encode_cache_salt(cache_salt.salt)
    if cache_salt is None:
        return b"\x00"
    key_bytes = cache_salt.encode("utf-8")
    return b"\x01" + struct.pack("<I", len(key_bytes)) + key_bytes


def hash_page(parent_hash: bytes, page_token_ids: Sequence[int], cache_salt: str | None) -> bytes:
    """Hash of one page given the hash of the page before it (ROOT_PAGE_HASH for the first)."""
    digest = hashlib.blake2b(digest_size=PAGE_HASH_NUM_BYTES)
    digest.update(parent_hash)
    digest.update(encode_cache_salt(cache_salt))
    digest.update(struct.pack(f"<{len(page_token_ids)}I", *page_token_ids))
    return digest.digest()


def hash_pages(
    parent_hash: bytes, token_ids: Sequence[int], page_size: int, cache_salt: str | None
) -> list[bytes]:
    """Chained hashes of each full page of ``token_ids``; a trailing partial page is ignored."""
    page_hashes = []
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        parent_hash = hash_page(parent_hash, token_ids[start : start + page_size], cache_salt)
        page_hashes.append(parent_hash)
    return page_hashes

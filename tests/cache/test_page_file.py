"""The page file format: what it accepts, and that every damage is caught."""

import pytest

from cache.page_file import (
    HEADER_NUM_BYTES,
    PageFileError,
    check_page_file,
    page_file_header,
    page_file_name,
    page_hash_of_file_name,
)

FINGERPRINT = bytes(range(16))
PAGE_HASH = bytes(range(16, 32))
PAYLOAD = bytes(range(256)) * 4


def test_a_written_page_checks_out_and_its_name_gives_its_key_back():
    header = page_file_header(FINGERPRINT, PAGE_HASH, PAYLOAD)
    assert len(header) == HEADER_NUM_BYTES
    check_page_file(header, PAYLOAD, FINGERPRINT, PAGE_HASH)
    assert page_hash_of_file_name(page_file_name(PAGE_HASH)) == PAGE_HASH
    assert page_hash_of_file_name("notes.txt") is None
    assert page_hash_of_file_name("zz" * 16 + ".kvpage") is None


@pytest.mark.parametrize("damage, fragment", [
    (lambda h, p: (h, p[:-1]), "payload of"),  # truncated
    (lambda h, p: (h, p[:100] + bytes([p[100] ^ 1]) + p[101:]), "checksum"),  # one bit flipped
    (lambda h, p: (h[:30] + bytes([h[30] ^ 1]) + h[31:], p), "page hash"),  # another key
    (lambda h, p: (b"X" + h[1:], p), "magic"),
    (lambda h, p: (h[:-1] + bytes([h[-1] ^ 1]), p), "checksum"),  # the checksum itself
    (lambda h, p: (h[:10], p), "header"),
])
def test_damage_is_a_page_file_error(damage, fragment):
    header, payload = damage(page_file_header(FINGERPRINT, PAGE_HASH, PAYLOAD), PAYLOAD)
    with pytest.raises(PageFileError, match=fragment):
        check_page_file(header, payload, FINGERPRINT, PAGE_HASH)


def test_a_page_of_another_tier_is_foreign():
    header = page_file_header(bytes(16), PAGE_HASH, PAYLOAD)
    with pytest.raises(PageFileError, match="fingerprint"):
        check_page_file(header, PAYLOAD, FINGERPRINT, PAGE_HASH)

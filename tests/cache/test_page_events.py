"""The radix tree's page events: every stored page reported once, every evicted page once."""

from cache import PageAllocator, RadixTree, hash_pages
from cache.page_events import PageEventKind


def _tree_with_log(page_size=2, num_pages=16):
    allocator = PageAllocator(num_pages)
    tree = RadixTree(page_size, allocator)
    events = []
    tree.page_listeners.append(events.append)
    return tree, allocator, events


def _insert(tree, allocator, token_ids, salt=None):
    page_ids = allocator.allocate(len(token_ids) // tree.page_size)
    tree.insert(token_ids, page_ids, salt)
    allocator.release(page_ids)


def test_insert_reports_only_new_pages_with_their_chained_hashes():
    tree, allocator, events = _tree_with_log()
    _insert(tree, allocator, [1, 2, 3, 4])
    _insert(tree, allocator, [1, 2, 3, 4, 5, 6])
    all_hashes = hash_pages(b"", [1, 2, 3, 4, 5, 6], 2, None)
    assert [(e.kind, e.page_hashes) for e in events] == [
        (PageEventKind.STORED, tuple(all_hashes[:2])),
        (PageEventKind.STORED, tuple(all_hashes[2:])),
    ]


def test_salt_is_part_of_the_reported_hashes():
    tree, allocator, events = _tree_with_log()
    _insert(tree, allocator, [1, 2], salt="tenant-a")
    _insert(tree, allocator, [1, 2], salt="tenant-b")
    assert events[0].page_hashes != events[1].page_hashes
    assert events[1].page_hashes == tuple(hash_pages(b"", [1, 2], 2, "tenant-b"))


def test_a_split_reports_nothing_and_evictions_report_what_went():
    tree, allocator, events = _tree_with_log()
    _insert(tree, allocator, [1, 2, 3, 4, 5, 6])
    tree.match_prefix([1, 2, 3, 4, 9, 9])  # splits the run after two pages
    assert len(events) == 1
    tree.evict(16)
    removed = [h for e in events if e.kind is PageEventKind.REMOVED for h in e.page_hashes]
    assert sorted(removed) == sorted(events[0].page_hashes)

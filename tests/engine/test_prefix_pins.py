"""Pinned prefixes survive eviction until their deadline, then become evictable again."""

from cache import PageAllocator, RadixTree
from engine.prefix_pins import PrefixPins

PAGE_SIZE = 4


def _tree_with(num_pages_total: int, *sequences: list[int]) -> tuple[RadixTree, PageAllocator]:
    allocator = PageAllocator(num_pages_total)
    tree = RadixTree(PAGE_SIZE, allocator)
    for tokens in sequences:
        page_ids = allocator.allocate(len(tokens) // PAGE_SIZE)
        tree.insert(tokens, page_ids)
        allocator.release(page_ids)  # the tree holds its own reference now
    return tree, allocator


def test_pinned_prefix_is_not_evicted_until_it_expires():
    agent_turn, other = list(range(12)), list(range(100, 108))
    tree, allocator = _tree_with(8, agent_turn, other)
    pins = PrefixPins(tree)
    assert pins.pin(agent_turn + [7, 7], None, seconds=30, now=0.0) == 12
    assert tree.evict(8) == 2  # only the unpinned sequence goes
    assert tree.match_prefix(agent_turn).num_tokens == 12
    assert pins.seconds_to_next_expiry(now=10.0) == 20.0
    assert pins.release_expired(now=29.0) == 0
    assert pins.release_expired(now=30.0) == 1 and len(pins) == 0
    assert tree.evict(8) == 3
    assert allocator.num_free_pages == 8


def test_pin_of_an_uncached_prefix_or_zero_seconds_pins_nothing():
    tree, _ = _tree_with(4, list(range(8)))
    pins = PrefixPins(tree)
    assert pins.pin([50, 51, 52, 53], None, seconds=30) == 0
    assert pins.pin(list(range(8)), None, seconds=0) == 0
    assert pins.pin(list(range(8)), "other-tenant", seconds=30) == 0  # salts keep tenants apart
    assert len(pins) == 0 and pins.seconds_to_next_expiry() is None


def test_every_pin_expires_and_unlocks_everything():
    tree, allocator = _tree_with(4, list(range(8)))
    pins = PrefixPins(tree)
    pins.pin(list(range(8)), None, seconds=30, now=0.0)
    pins.pin(list(range(4)), None, seconds=60, now=0.0)
    assert pins.release_expired(now=60.0) == 2 and len(pins) == 0
    assert tree.evict(4) == 2 and allocator.num_free_pages == 4

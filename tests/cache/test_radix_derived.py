"""Derived KV in the radix tree: cached under a DerivedSalt below the exact node where a request's
exact KV ended; a plain-salt walk never reaches it, a walk given the derived salt continues into it."""

from hypothesis import given, settings
from hypothesis import strategies as st

from cache import DerivedSalt, PageAllocator, RadixTree, cached_prefix_pages, check_tree_invariants


def _tree(page_size=2, num_pages=32):
    allocator = PageAllocator(num_pages)
    return RadixTree(page_size, allocator), allocator


def _cache(tree, allocator, token_ids, salt=None, num_exact_pages=None):
    page_ids = allocator.allocate(len(token_ids) // tree.page_size)
    derived = None if num_exact_pages is None else DerivedSalt(salt)
    tree.insert(token_ids, page_ids, salt, derived, num_exact_pages)
    allocator.release(page_ids)
    check_tree_invariants(tree)
    return page_ids


def test_plain_walks_see_only_exact_pages():
    tree, allocator = _tree()
    page_ids = _cache(tree, allocator, [1, 2, 3, 4, 5, 6, 7, 8], num_exact_pages=2)
    assert tree.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).page_ids == page_ids[:2]
    derived = tree.match_prefix([1, 2, 3, 4, 5, 6, 7, 8], None, DerivedSalt(None))
    assert derived.page_ids == page_ids and derived.num_tokens == 8
    # another tenant's derived walk finds nothing, not even the exact part
    assert tree.match_prefix([1, 2, 3, 4, 5, 6], "t", DerivedSalt("t")).num_tokens == 0


def test_exact_and_derived_continuations_live_side_by_side():
    tree, allocator = _tree()
    derived_ids = _cache(tree, allocator, [1, 2, 3, 4, 5, 6], num_exact_pages=1)
    exact_ids = _cache(tree, allocator, [1, 2, 3, 4, 5, 6])  # the same tokens computed exactly
    assert tree.match_prefix([1, 2, 3, 4, 5, 6]).page_ids == [derived_ids[0], *exact_ids[1:]]
    # exact pages as far as allowed, then derived
    walk = tree.match_prefix([1, 2, 3, 4, 5, 6], None, DerivedSalt(None), max_exact_pages=1)
    assert walk.page_ids == derived_ids
    assert tree.num_cached_pages == 5


def test_derived_insert_counts_what_was_cached_and_eviction_frees_all():
    tree, allocator = _tree()
    _cache(tree, allocator, [1, 2, 3, 4, 5, 6], num_exact_pages=1)
    page_ids = allocator.allocate(4)
    assert tree.insert([1, 2, 3, 4, 5, 6, 7, 8], page_ids, None, DerivedSalt(None), 1) == 6
    allocator.release(page_ids)
    check_tree_invariants(tree)
    walk = tree.match_prefix([1, 2, 3, 4, 5, 6, 7, 8], None, DerivedSalt(None), max_exact_pages=1)
    tree.lock(walk.last_node)
    assert tree.num_locked_pages == 4
    tree.unlock(walk.last_node)
    assert tree.evict(100) == 4
    assert allocator.num_free_pages == allocator.num_pages
    check_tree_invariants(tree)


def test_no_exact_pages_hangs_derived_below_the_root():
    tree, allocator = _tree()
    page_ids = _cache(tree, allocator, [9, 8, 7, 6], num_exact_pages=0)
    assert tree.match_prefix([9, 8, 7, 6]).num_tokens == 0
    assert tree.match_prefix([9, 8, 7, 6], None, DerivedSalt(None), max_exact_pages=0).page_ids == page_ids


# -- property: random exact and derived inserts, matches and evictions ---------------------------

_TOKENS = st.lists(st.integers(0, 2), min_size=0, max_size=10)
_OPS = st.lists(st.one_of(
    st.tuples(st.just("insert"), _TOKENS, st.sampled_from([None, "t"]), st.one_of(st.none(), st.integers(0, 5))),
    st.tuples(st.just("match"), _TOKENS, st.sampled_from([None, "t"]), st.booleans()),
    st.tuples(st.just("evict"), st.integers(1, 6)),
), max_size=30)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, page_size=st.integers(1, 3))
def test_plain_walks_only_ever_return_exact_pages(ops, page_size):
    tree, allocator = _tree(page_size=page_size, num_pages=24)
    for op in ops:
        if op[0] == "insert":
            _, tokens, salt, num_exact_pages = op
            num_pages = len(tokens) // page_size
            if num_pages > allocator.num_free_pages:
                tree.evict(num_pages - allocator.num_free_pages)
            if num_pages > allocator.num_free_pages:
                continue
            page_ids = allocator.allocate(num_pages)
            derived = None if num_exact_pages is None else DerivedSalt(salt)
            tree.insert(tokens, page_ids, salt, derived, num_exact_pages)
            allocator.release(page_ids)
        elif op[0] == "match":
            _, tokens, salt, with_derived = op
            prefix_pages = cached_prefix_pages(tree)
            match = tree.match_prefix(tokens, salt, DerivedSalt(salt) if with_derived else None)
            for index, page_id in enumerate(match.page_ids):
                prefix = tuple(tokens[: (index + 1) * page_size])
                allowed = {prefix_pages.get((salt, prefix))}
                if with_derived:
                    allowed.add(prefix_pages.get((DerivedSalt(salt), prefix)))
                assert page_id in allowed - {None}
        else:
            tree.evict(op[1])
        check_tree_invariants(tree)
        assert allocator.num_free_pages + tree.num_cached_pages == allocator.num_pages


def test_page_events_say_which_pages_are_derived():
    tree, allocator = _tree()
    events = []
    tree.page_listeners.append(events.append)
    _cache(tree, allocator, [1, 2, 3, 4, 5, 6], num_exact_pages=1)
    assert [(event.kind.value, len(event.page_hashes), event.is_derived) for event in events] == [
        ("stored", 1, False), ("stored", 2, True)]
    events.clear()
    tree.evict(3)
    assert sorted((len(event.page_hashes), event.is_derived) for event in events) == [(1, False), (2, True)]

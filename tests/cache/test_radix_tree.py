import pytest

from cache import (
    LFUPolicy,
    PageAllocator,
    RadixTree,
    cached_prefix_pages,
    check_tree_invariants,
)


def make_tree(page_size=2, num_pages=32, policy=None):
    allocator = PageAllocator(num_pages)
    return RadixTree(page_size, allocator, policy), allocator


def cache_tokens(tree, allocator, token_ids, cache_salt=None):
    """Insert like a finished request: allocate, insert, drop the request's own references."""
    page_ids = allocator.allocate(len(token_ids) // tree.page_size)
    num_cached_tokens = tree.insert(token_ids, page_ids, cache_salt)
    allocator.release(page_ids)
    check_tree_invariants(tree)
    return page_ids, num_cached_tokens


def test_empty_tree_matches_nothing():
    tree, _ = make_tree()
    match = tree.match_prefix([1, 2, 3])
    assert (match.page_ids, match.num_tokens, match.last_node) == ([], 0, tree.root)


def test_only_full_pages_are_cached_and_matched():
    tree, allocator = make_tree(page_size=2)
    page_ids, num_cached_tokens = cache_tokens(tree, allocator, [1, 2, 3, 4, 5])
    assert num_cached_tokens == 0
    assert tree.num_cached_pages == 2
    match = tree.match_prefix([1, 2, 3, 4, 5, 6])
    assert (match.page_ids, match.num_tokens) == (page_ids, 4)
    assert tree.match_prefix([1, 2, 3]).page_ids == page_ids[:1]
    assert tree.match_prefix([1]).num_tokens == 0


def test_match_ending_inside_a_node_splits_it_at_the_page_boundary():
    tree, allocator = make_tree(page_size=2)
    page_ids, _ = cache_tokens(tree, allocator, [1, 2, 3, 4, 5, 6])
    match = tree.match_prefix([1, 2, 3, 4, 9, 9])
    assert match.page_ids == page_ids[:2]
    assert match.last_node.page_ids == page_ids[:2]
    assert match.last_node.token_ids == (1, 2, 3, 4)
    assert tree.num_cached_pages == 3
    check_tree_invariants(tree)


def test_divergence_inside_a_page_does_not_share_that_page():
    tree, allocator = make_tree(page_size=2)
    first_page_ids, _ = cache_tokens(tree, allocator, [1, 2, 3, 4])
    second_page_ids, num_cached_tokens = cache_tokens(tree, allocator, [1, 2, 3, 9])
    assert num_cached_tokens == 2
    assert tree.match_prefix([1, 2, 3, 4]).page_ids == first_page_ids
    assert tree.match_prefix([1, 2, 3, 9]).page_ids == [first_page_ids[0], second_page_ids[1]]
    # The request's duplicate of page [1, 2] was not retained, so it is free again.
    assert allocator.ref_count(second_page_ids[0]) == 0
    assert allocator.num_free_pages + tree.num_cached_pages == allocator.num_pages


def test_insert_returns_cached_tokens_and_retains_only_new_pages():
    tree, allocator = make_tree(page_size=1)
    page_ids = allocator.allocate(3)
    assert tree.insert([5, 6, 7], page_ids) == 0
    assert [allocator.ref_count(p) for p in page_ids] == [2, 2, 2]
    more_page_ids = allocator.allocate(4)
    assert tree.insert([5, 6, 7, 8], more_page_ids) == 3
    assert [allocator.ref_count(p) for p in more_page_ids] == [1, 1, 1, 2]
    with pytest.raises(ValueError):
        tree.insert([1, 2], [0])


def test_locked_nodes_are_never_evicted():
    tree, allocator = make_tree(page_size=1)
    cache_tokens(tree, allocator, [1, 2, 3])
    cache_tokens(tree, allocator, [1, 2, 4])
    match = tree.match_prefix([1, 2, 3])
    tree.lock(match.last_node)
    assert (tree.num_locked_pages, tree.num_evictable_pages) == (3, 1)
    assert tree.evict(10) == 1
    assert tree.match_prefix([1, 2, 3]).num_tokens == 3
    assert tree.match_prefix([1, 2, 4]).num_tokens == 2
    tree.unlock(match.last_node)
    assert tree.evict(10) == 3
    assert allocator.num_free_pages == allocator.num_pages
    check_tree_invariants(tree)


def test_evict_stops_once_enough_pages_are_released():
    tree, allocator = make_tree(page_size=1)
    cache_tokens(tree, allocator, [1, 1])
    cache_tokens(tree, allocator, [2, 2])
    cache_tokens(tree, allocator, [3, 3])
    assert tree.evict(3) == 4  # whole nodes of 2 pages
    assert tree.num_cached_pages == 2
    assert tree.evict(0) == 0


def test_lru_evicts_least_recently_used_leaf_and_then_its_parent():
    tree, allocator = make_tree(page_size=1)
    cache_tokens(tree, allocator, [1, 2])
    cache_tokens(tree, allocator, [1, 3])
    cache_tokens(tree, allocator, [4])
    tree.match_prefix([1, 2])
    assert tree.evict(1) == 1  # [1, 3] is oldest
    assert tree.match_prefix([1, 3]).num_tokens == 1
    assert tree.evict(1) == 1  # then [4]
    assert tree.match_prefix([4]).num_tokens == 0
    assert tree.evict(2) == 2  # then leaf [1, 2] and its parent [1], now a leaf
    assert tree.num_cached_pages == 0


def test_lfu_evicts_fewest_hits_first():
    tree, allocator = make_tree(page_size=1, policy=LFUPolicy())
    cache_tokens(tree, allocator, [1])
    cache_tokens(tree, allocator, [2])
    tree.match_prefix([1])
    tree.match_prefix([1])
    tree.match_prefix([2])
    assert tree.evict(1) == 1
    assert tree.match_prefix([1]).num_tokens == 1
    assert tree.match_prefix([2]).num_tokens == 0


def test_split_keeps_locks_balanced():
    tree, allocator = make_tree(page_size=1)
    cache_tokens(tree, allocator, [1, 2, 3, 4])
    deep = tree.match_prefix([1, 2, 3, 4]).last_node
    tree.lock(deep)
    shallow = tree.match_prefix([1, 2]).last_node  # splits the locked node
    assert shallow is not deep and shallow.lock_ref == 1
    tree.lock(shallow)
    check_tree_invariants(tree)
    tree.unlock(deep)
    tree.unlock(shallow)
    assert (tree.num_locked_pages, tree.num_evictable_pages) == (0, 4)
    check_tree_invariants(tree)


def test_bad_unlock_and_stale_nodes_raise():
    tree, allocator = make_tree(page_size=1)
    cache_tokens(tree, allocator, [1])
    node = tree.match_prefix([1]).last_node
    with pytest.raises(ValueError):
        tree.unlock(node)
    tree.evict(1)
    with pytest.raises(ValueError):
        tree.lock(node)
    tree.lock(tree.root)  # the root holds nothing; locking it is a no-op
    tree.unlock(tree.root)


def test_cache_salts_never_share_pages():
    tree, allocator = make_tree(page_size=2)
    page_ids_by_key = {
        key: cache_tokens(tree, allocator, [1, 2, 3, 4], key)[0] for key in (None, "", "t")
    }
    assert tree.num_cached_pages == 6
    for key, page_ids in page_ids_by_key.items():
        match = tree.match_prefix([1, 2, 3, 4], key)
        assert match.page_ids == page_ids
    last_nodes = [tree.match_prefix([1, 2], key).last_node for key in page_ids_by_key]
    hashes = {tuple(tree.page_hashes(node)) for node in last_nodes}
    assert len(hashes) == 3
    assert tree.match_prefix([1, 2], "other").num_tokens == 0
    assert len(cached_prefix_pages(tree)) == 6


def test_page_hashes_agree_across_trees_with_different_page_ids():
    tree_a, allocator_a = make_tree(page_size=2)
    tree_b, allocator_b = make_tree(page_size=2)
    allocator_b.allocate(5)
    cache_tokens(tree_a, allocator_a, [1, 2, 3, 4, 5, 6])
    cache_tokens(tree_b, allocator_b, [1, 2, 3, 4])
    cache_tokens(tree_b, allocator_b, [1, 2, 3, 4, 5, 6, 7, 8])
    hashes_a = tree_a.page_hashes(tree_a.match_prefix([1, 2, 3, 4, 5, 6]).last_node)
    hashes_b = tree_b.page_hashes(tree_b.match_prefix([1, 2, 3, 4, 5, 6]).last_node)
    assert hashes_a == hashes_b and len(hashes_a) == 3
    assert tree_a.page_hashes(tree_a.root) == []


def test_peek_prefix_finds_what_match_finds_and_changes_nothing():
    tree2, allocator2 = make_tree(policy=LFUPolicy())
    cache_tokens(tree2, allocator2, [1, 2, 3, 4, 5, 6], "salt")
    [node2] = tree2.root.children.values()
    before = (node2.last_access_time, node2.hit_count, node2.num_pages)
    assert tree2.peek_prefix([1, 2, 3, 4, 9, 9], "salt") == 4  # ends inside the node: no split
    assert tree2.peek_prefix([1, 2, 3, 4, 5, 6, 7], "salt") == 6 and tree2.peek_prefix([1, 2], None) == 0
    assert (node2.last_access_time, node2.hit_count, node2.num_pages) == before
    assert list(tree2.root.children.values()) == [node2]
    assert tree2.match_prefix([1, 2, 3, 4, 9, 9], "salt").num_tokens == 4  # the match agrees (and splits)


def test_allocate_pages_evicts_unlocked_cache_for_what_it_hands_out():
    tree, allocator = make_tree(num_pages=4)
    cache_tokens(tree, allocator, [1, 2, 3, 4, 5, 6])  # 3 cached pages, 1 free
    assert tree.num_allocatable_pages == 4
    pages = tree.allocate_pages(2)
    assert len(pages) == 2 and tree.num_evicted_pages >= 1
    assert tree.allocate_pages(4) is None  # 2 held by the caller: never enough
    tree.release_pages(pages)
    assert allocator.num_free_pages + tree.num_cached_pages == 4

"""Property tests: the tree, driven like the engine drives it, against a naive reference.

The reference keeps one entry per cached full-page prefix, keyed (cache_salt, prefix tokens),
with the page id that holds the prefix's last page, its last access tick and its hit count.
Longest-prefix matching on it is a loop over prefix lengths. Every step then compares the
whole tree (every prefix, page id, lock, access time, ref count) with the reference.
"""

from collections import Counter
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cache import (
    LFUPolicy,
    LRUPolicy,
    OutOfPages,
    PageAllocator,
    RadixTree,
    cached_page_ids,
    cached_prefix_pages,
    check_tree_invariants,
    hash_pages,
)

# Tiny vocabulary so that prefixes collide; lengths uniform, not Hypothesis's usual short lists.
TOKENS = st.integers(0, 12).flatmap(
    lambda num_tokens: st.lists(st.integers(0, 2), min_size=num_tokens, max_size=num_tokens)
).map(tuple)
CACHE_SALTS = st.sampled_from([None, "", "t"])
NUM_POOL_PAGES = 16
MAX_RUNNING_REQUESTS = 4


@dataclass
class Request:
    token_ids: tuple[int, ...]
    cache_salt: str | None
    locked_node: object
    num_locked_pages: int  # pages of the prefix pinned by locked_node
    page_table: list[int]  # one page per token page, the last one maybe partial
    own_page_ids: list[int]  # pages this request holds a reference on


class CacheMachine(RuleBasedStateMachine):
    policy_class = LRUPolicy

    @initialize(page_size=st.integers(1, 4))
    def create(self, page_size):
        self.page_size = page_size
        self.allocator = PageAllocator(NUM_POOL_PAGES)
        self.tree = RadixTree(page_size, self.allocator, self.policy_class())
        self.ref_page_ids = {}  # (cache_salt, prefix) -> page id of the prefix's last page
        self.ref_access_times = {}  # (cache_salt, prefix) -> tick of the last match/insert over it
        self.ref_hit_counts = {}  # (cache_salt, prefix) -> matches over it
        self.clock = 0  # ticks once per match/insert, like the tree's
        self.requests: list[Request] = []
        self.seen_token_ids: list[tuple[int, ...]] = []

    # -- reference model ------------------------------------------------------------------

    def prefix_keys(self, token_ids, cache_salt, num_pages):
        return [(cache_salt, token_ids[: k * self.page_size]) for k in range(1, num_pages + 1)]

    def expected_match(self, token_ids, cache_salt) -> list[int]:
        page_ids = []
        for key in self.prefix_keys(token_ids, cache_salt, len(token_ids) // self.page_size):
            if key not in self.ref_page_ids:
                break
            page_ids.append(self.ref_page_ids[key])
        return page_ids

    def priority(self, key):
        if self.policy_class is LFUPolicy:
            return (self.ref_hit_counts[key], self.ref_access_times[key])
        return (self.ref_access_times[key],)

    def locked_keys(self) -> set:
        return {
            key
            for request in self.requests
            for key in self.prefix_keys(
                request.token_ids, request.cache_salt, request.num_locked_pages
            )
        }

    # -- the tree, driven like the engine drives it ------------------------------------------

    def draw_token_ids(self, data):
        """Mostly a cut of an earlier sequence plus a few new tokens, so paths share and split."""
        if self.seen_token_ids and data.draw(st.integers(0, 3)):
            base = self.seen_token_ids[data.draw(st.integers(0, len(self.seen_token_ids) - 1))]
            cut = data.draw(st.integers(0, len(base)))
            suffix = data.draw(st.lists(st.integers(0, 2), max_size=4))
            return base[:cut] + tuple(suffix)
        return data.draw(TOKENS)

    def match(self, token_ids, cache_salt):
        expected_page_ids = self.expected_match(token_ids, cache_salt)
        result = self.tree.match_prefix(token_ids, cache_salt)
        assert result.page_ids == expected_page_ids
        assert result.num_tokens == len(expected_page_ids) * self.page_size
        self.clock += 1
        for key in self.prefix_keys(token_ids, cache_salt, len(expected_page_ids)):
            self.ref_access_times[key] = self.clock
            self.ref_hit_counts[key] += 1
        return result

    def insert(self, token_ids, page_table, cache_salt):
        num_pages = len(token_ids) // self.page_size
        num_cached_pages = len(self.expected_match(token_ids, cache_salt))
        num_cached_tokens = self.tree.insert(token_ids, page_table, cache_salt)
        assert num_cached_tokens == num_cached_pages * self.page_size
        self.clock += 1
        for page_index, key in enumerate(self.prefix_keys(token_ids, cache_salt, num_pages)):
            if page_index >= num_cached_pages:
                self.ref_page_ids[key] = page_table[page_index]
                self.ref_hit_counts[key] = 0
            self.ref_access_times[key] = self.clock

    def evict(self, num_pages):
        before = dict(self.ref_page_ids)
        ref_counts_before = {p: self.allocator.ref_count(p) for p in before.values()}
        locked_keys = self.locked_keys()
        num_evictable_before = self.tree.num_evictable_pages
        num_released = self.tree.evict(num_pages)
        after = cached_prefix_pages(self.tree)
        assert after.items() <= before.items(), "evict changed or added a cached prefix"
        evicted_keys = before.keys() - after.keys()
        assert num_released == len(evicted_keys) <= num_evictable_before
        assert locked_keys.isdisjoint(evicted_keys), "a locked page was evicted"
        if num_released < num_pages:
            assert self.tree.num_evictable_pages == 0, "evict stopped early"
        if num_pages <= 0:
            assert num_released == 0
        for key in evicted_keys:
            assert self.allocator.ref_count(before[key]) == ref_counts_before[before[key]] - 1
        if evicted_keys:
            # Evicted in priority order: every unlocked leaf left ranks at or after them all.
            last_evicted_priority = max(self.priority(key) for key in evicted_keys)
            parent_keys = {(k, prefix[: -self.page_size]) for k, prefix in after}
            for key in after.keys() - parent_keys - locked_keys:
                assert self.priority(key) >= last_evicted_priority, "evicted out of policy order"
        for key in evicted_keys:
            del self.ref_access_times[key], self.ref_hit_counts[key]
        self.ref_page_ids = after
        return num_released

    def end_request(self, request, is_finished):
        self.requests.remove(request)
        if is_finished:
            self.insert(request.token_ids, request.page_table, request.cache_salt)
        self.tree.unlock(request.locked_node)
        self.allocator.release(request.own_page_ids)

    # -- rules -------------------------------------------------------------------------------

    @precondition(lambda self: len(self.requests) < MAX_RUNNING_REQUESTS)
    @rule(data=st.data(), cache_salt=CACHE_SALTS)
    def start_request(self, data, cache_salt):
        token_ids = self.draw_token_ids(data)
        self.seen_token_ids.append(token_ids)
        matched = self.match(token_ids, cache_salt)
        self.tree.lock(matched.last_node)
        num_matched_pages = len(matched.page_ids)
        request = Request(
            token_ids, cache_salt, matched.last_node, num_matched_pages, list(matched.page_ids), []
        )
        self.requests.append(request)
        num_new_pages = -(-len(token_ids) // self.page_size) - len(matched.page_ids)
        num_short_pages = num_new_pages - self.allocator.num_free_pages
        if num_short_pages > 0:
            self.evict(num_short_pages)
        num_free_pages = self.allocator.num_free_pages
        try:
            request.own_page_ids = self.allocator.allocate(num_new_pages)
        except OutOfPages:
            assert self.allocator.num_free_pages == num_free_pages < num_new_pages
            self.end_request(request, is_finished=False)
            return
        request.page_table += request.own_page_ids

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def insert_chunk(self, data):
        """Cache a finished prefill chunk mid-request, then move the lock and page table onto
        the tree's pages, releasing the request's duplicates (as the scheduler does)."""
        request = data.draw(st.sampled_from(self.requests))
        num_full_pages = len(request.token_ids) // self.page_size
        num_chunk_pages = data.draw(st.integers(request.num_locked_pages, num_full_pages))
        chunk_token_ids = request.token_ids[: num_chunk_pages * self.page_size]
        self.insert(chunk_token_ids, request.page_table, request.cache_salt)
        matched = self.match(chunk_token_ids, request.cache_salt)
        assert len(matched.page_ids) == num_chunk_pages
        self.tree.lock(matched.last_node)
        self.tree.unlock(request.locked_node)
        for own_page_id, tree_page_id in zip(request.page_table, matched.page_ids):
            if own_page_id != tree_page_id:
                request.own_page_ids.remove(own_page_id)  # only own pages can be duplicates
                self.allocator.release([own_page_id])
        request.page_table[:num_chunk_pages] = matched.page_ids
        request.locked_node, request.num_locked_pages = matched.last_node, num_chunk_pages

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), is_finished=st.booleans())
    def end_some_request(self, data, is_finished):
        self.end_request(data.draw(st.sampled_from(self.requests)), is_finished)

    @rule(data=st.data(), cache_salt=CACHE_SALTS)
    def match_only(self, data, cache_salt):
        self.match(self.draw_token_ids(data), cache_salt)

    @rule(num_pages=st.integers(-1, 4))
    def evict_pages(self, num_pages):
        self.evict(num_pages)

    @precondition(lambda self: len(self.requests) == MAX_RUNNING_REQUESTS)
    @rule()
    def drain(self):
        for request in list(self.requests):
            self.end_request(request, is_finished=True)
        self.check_drained()

    def check_drained(self):
        """No request running: the tree holds the only references, free + cached == total."""
        assert self.tree.num_locked_pages == 0
        assert self.allocator.num_free_pages + self.tree.num_cached_pages == NUM_POOL_PAGES
        in_use = {p for p in range(NUM_POOL_PAGES) if self.allocator.ref_count(p) > 0}
        assert in_use == set(cached_page_ids(self.tree))

    # -- checked after every step ---------------------------------------------------------

    @invariant()
    def tree_equals_reference(self):
        check_tree_invariants(self.tree)
        assert cached_prefix_pages(self.tree) == self.ref_page_ids
        assert self.tree.num_cached_pages == len(self.ref_page_ids)
        assert self.tree.num_locked_pages == len(self.locked_keys())
        for node, path_token_ids in walk_nodes(self.tree):
            key = (node.cache_salt, path_token_ids)
            assert node.last_access_time == self.ref_access_times[key]
            assert node.hit_count == self.ref_hit_counts[key]
            assert node.lock_ref == sum(
                request.cache_salt == node.cache_salt
                and request.num_locked_pages * self.page_size >= len(path_token_ids)
                and request.token_ids[: len(path_token_ids)] == path_token_ids
                for request in self.requests
            )

    @invariant()
    def ref_counts_are_tree_plus_requests(self):
        holders = Counter(self.ref_page_ids.values())
        for request in self.requests:
            holders.update(request.own_page_ids)
        for page_id in range(NUM_POOL_PAGES):
            assert self.allocator.ref_count(page_id) == holders[page_id]
        assert self.allocator.num_free_pages == NUM_POOL_PAGES - len(holders)

    def teardown(self):
        if not hasattr(self, "tree"):
            return
        for request in list(self.requests):
            self.end_request(request, is_finished=False)
        self.check_drained()
        assert self.tree.evict(NUM_POOL_PAGES) == len(self.ref_page_ids)
        assert self.allocator.num_free_pages == NUM_POOL_PAGES


class LFUCacheMachine(CacheMachine):
    policy_class = LFUPolicy


def walk_nodes(tree):
    """(node, tokens from the root through the node) for every node but the root."""
    stack = [(child, child.token_ids) for child in tree.root.children.values()]
    while stack:
        node, path_token_ids = stack.pop()
        yield node, path_token_ids
        stack.extend((child, path_token_ids + child.token_ids) for child in node.children.values())


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestLFUCacheMachine = LFUCacheMachine.TestCase
TestLFUCacheMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@settings(max_examples=100, deadline=None)
@given(
    page_size=st.integers(1, 4),
    sequences=st.lists(st.tuples(TOKENS, CACHE_SALTS), min_size=1, max_size=6),
    num_offset_pages=st.integers(0, 5),
)
def test_page_hashes_name_prefixes_across_trees(page_size, sequences, num_offset_pages):
    """Two trees filled in opposite orders, with different page ids, agree on every hash."""
    allocator_a, allocator_b = PageAllocator(64), PageAllocator(64)
    allocator_b.allocate(num_offset_pages)
    tree_a, tree_b = RadixTree(page_size, allocator_a), RadixTree(page_size, allocator_b)
    for tree, allocator, order in ((tree_a, allocator_a, 1), (tree_b, allocator_b, -1)):
        for token_ids, cache_salt in sequences[::order]:
            page_ids = allocator.allocate(len(token_ids) // page_size)
            tree.insert(token_ids, page_ids, cache_salt)
            allocator.release(page_ids)
    for token_ids, cache_salt in sequences:
        match_a = tree_a.match_prefix(token_ids, cache_salt)
        match_b = tree_b.match_prefix(token_ids, cache_salt)
        assert match_a.num_tokens == match_b.num_tokens == len(token_ids) // page_size * page_size
        hashes = tree_a.page_hashes(match_a.last_node)
        assert hashes == tree_b.page_hashes(match_b.last_node)
        assert hashes == hash_pages(b"", token_ids, page_size, cache_salt)
        for other_key in {None, "", "t"} - {cache_salt}:
            other_hashes = hash_pages(b"", token_ids, page_size, other_key)
            assert set(hashes).isdisjoint(other_hashes)

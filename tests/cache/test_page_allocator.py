import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cache import OutOfPages, PageAllocator, PageRefError


def test_fresh_pool_hands_out_low_ids_first():
    allocator = PageAllocator(8)
    assert allocator.allocate(3) == [0, 1, 2]
    assert allocator.allocate(2) == [3, 4]
    assert allocator.num_free_pages == 3


def test_allocate_zero_pages():
    allocator = PageAllocator(2)
    assert allocator.allocate(0) == []
    assert allocator.num_free_pages == 2


def test_out_of_pages_leaves_pool_unchanged():
    allocator = PageAllocator(4)
    page_ids = allocator.allocate(3)
    with pytest.raises(OutOfPages) as raised:
        allocator.allocate(2)
    assert (raised.value.num_requested, raised.value.num_free) == (2, 1)
    assert allocator.num_free_pages == 1
    assert [allocator.ref_count(page_id) for page_id in page_ids] == [1, 1, 1]
    assert allocator.allocate(1) == [3]


def test_page_is_freed_when_last_reference_goes():
    allocator = PageAllocator(2)
    [page_id] = allocator.allocate(1)
    allocator.retain([page_id])
    assert allocator.ref_count(page_id) == 2
    allocator.release([page_id])
    assert allocator.num_free_pages == 1
    allocator.release([page_id])
    assert allocator.ref_count(page_id) == 0
    assert allocator.num_free_pages == 2


def test_freed_page_is_reused_first():
    allocator = PageAllocator(4)
    page_ids = allocator.allocate(3)
    allocator.release([page_ids[1]])
    assert allocator.allocate(1) == [page_ids[1]]


def test_double_free_raises_and_changes_nothing():
    allocator = PageAllocator(3)
    page_ids = allocator.allocate(2)
    allocator.release([page_ids[0]])
    with pytest.raises(PageRefError, match="freed twice"):
        allocator.release([page_ids[1], page_ids[0]])
    assert allocator.ref_count(page_ids[1]) == 1
    with pytest.raises(PageRefError):
        allocator.release([page_ids[1], page_ids[1]])  # one reference, released twice in one call
    assert allocator.ref_count(page_ids[1]) == 1
    assert allocator.num_free_pages == 2


def test_retain_of_free_or_unknown_page_raises():
    allocator = PageAllocator(2)
    with pytest.raises(PageRefError):
        allocator.retain([0])
    with pytest.raises(PageRefError):
        allocator.ref_count(2)
    with pytest.raises(PageRefError):
        allocator.release([-1])


class AllocatorMachine(RuleBasedStateMachine):
    """Random allocate/retain/release against a dict of expected ref counts."""

    num_pages = 6

    def __init__(self):
        super().__init__()
        self.allocator = PageAllocator(self.num_pages)
        self.expected_ref_counts: dict[int, int] = {}  # allocated pages only

    @rule(num_pages=st.integers(0, 4))
    def allocate(self, num_pages):
        num_free = self.num_pages - len(self.expected_ref_counts)
        if num_pages > num_free:
            with pytest.raises(OutOfPages):
                self.allocator.allocate(num_pages)
            return
        page_ids = self.allocator.allocate(num_pages)
        assert len(set(page_ids)) == num_pages
        assert self.expected_ref_counts.keys().isdisjoint(page_ids)
        self.expected_ref_counts.update(dict.fromkeys(page_ids, 1))

    @precondition(lambda self: self.expected_ref_counts)
    @rule(data=st.data())
    def retain(self, data):
        page_id = data.draw(st.sampled_from(sorted(self.expected_ref_counts)))
        self.allocator.retain([page_id])
        self.expected_ref_counts[page_id] += 1

    @rule(page_id=st.integers(0, num_pages - 1))
    def release(self, page_id):
        if page_id not in self.expected_ref_counts:
            with pytest.raises(PageRefError):
                self.allocator.release([page_id])
            return
        self.allocator.release([page_id])
        self.expected_ref_counts[page_id] -= 1
        if self.expected_ref_counts[page_id] == 0:
            del self.expected_ref_counts[page_id]

    @invariant()
    def ref_counts_match(self):
        for page_id in range(self.num_pages):
            assert self.allocator.ref_count(page_id) == self.expected_ref_counts.get(page_id, 0)
        assert self.allocator.num_free_pages == self.num_pages - len(self.expected_ref_counts)


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)

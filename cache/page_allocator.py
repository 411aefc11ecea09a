"""Ref-counted allocator over a fixed pool of KV page ids.

The pool never grows. A page is free exactly when its ref count is 0. Every holder of a page
(a running request, the radix tree) owns one reference and gives it back with ``release``; the
page returns to the free list when its last reference goes. Misuse (releasing a free page,
retaining one that was never allocated) raises ``PageRefError`` before any count changes.
"""

from collections import Counter
from collections.abc import Iterable


class OutOfPages(Exception):
    """``allocate`` asked for more pages than are free. The pool is left unchanged."""

    def __init__(self, num_requested: int, num_free: int):
        self.num_requested = num_requested
        self.num_free = num_free
        super().__init__(f"asked for {num_requested} KV pages, only {num_free} free")


class PageRefError(Exception):
    """A ref count would go wrong: a free page retained or released (freed twice), or a page
    id outside the pool. Always a bug in the caller, never a resource shortage."""


class PageAllocator:
    """Hands out page ids from ``range(num_pages)``; each call costs O(pages in the call)."""

    def __init__(self, num_pages: int):
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self.num_pages = num_pages
        self._ref_counts = [0] * num_pages  # (num_pages,), 0 means free
        # Stack of free page ids, top at the end. A fresh pool hands out low ids first; after
        # that it is LIFO, so a page freed recently is reused first.
        self._free_page_ids = list(range(num_pages - 1, -1, -1))

    @property
    def num_free_pages(self) -> int:
        return len(self._free_page_ids)

    def allocate(self, num_pages: int) -> list[int]:
        """Take ``num_pages`` free pages, each with ref count 1.

        Raises OutOfPages, changing nothing, when fewer are free.
        """
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        if num_pages > len(self._free_page_ids):
            raise OutOfPages(num_pages, len(self._free_page_ids))
        if num_pages == 0:
            return []  # the slice below would take the whole list
        page_ids = self._free_page_ids[-num_pages:]
        del self._free_page_ids[-num_pages:]
        page_ids.reverse()
        for page_id in page_ids:
            self._ref_counts[page_id] = 1
        return page_ids

    def retain(self, page_ids: Iterable[int]) -> None:
        """Add one reference to each page (listed twice: two). Each must be allocated."""
        num_refs_by_page = Counter(page_ids)
        for page_id in num_refs_by_page:
            if self.ref_count(page_id) == 0:
                raise PageRefError(f"retain of page {page_id}, which is free")
        for page_id, num_refs in num_refs_by_page.items():
            self._ref_counts[page_id] += num_refs

    def release(self, page_ids: Iterable[int]) -> None:
        """Drop one reference from each page; a page whose count reaches 0 becomes free."""
        num_refs_by_page = Counter(page_ids)
        for page_id, num_refs in num_refs_by_page.items():
            ref_count = self.ref_count(page_id)
            if ref_count < num_refs:
                raise PageRefError(
                    f"release of page {page_id} {num_refs} time(s) with ref count {ref_count}: "
                    "freed twice"
                )
        for page_id, num_refs in num_refs_by_page.items():
            self._ref_counts[page_id] -= num_refs
            if self._ref_counts[page_id] == 0:
                self._free_page_ids.append(page_id)

    def ref_count(self, page_id: int) -> int:
        if not 0 <= page_id < self.num_pages:
            raise PageRefError(f"page id {page_id} outside the pool of {self.num_pages} pages")
        return self._ref_counts[page_id]

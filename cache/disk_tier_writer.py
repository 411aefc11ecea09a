"""The disk tier's background writer: a queue bounded in bytes, drained by one thread.

The engine thread only enqueues (a buffer it already copied out of the pool); the file I/O
runs here. A page stays readable from the queue (``pending``) until its file is in place, so
a page evicted from the pool before its write finished is still served, and written, from
the copy: the pool slot it came from can be reused at once.
"""

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

logger = logging.getLogger("radixserve.kv_tier")


class PageWriteQueue:
    """FIFO of (page hash, payload) with at most ``max_pending_bytes`` of payload queued.

    ``write_page(page_hash, payload)`` runs on the writer thread, one page at a time; an
    exception it raises is logged and the page dropped (counted in num_dropped_pages).
    """

    def __init__(self, write_page: Callable[[bytes, memoryview], None], max_pending_bytes: int,
                 thread_name: str = "radixserve-kv-disk-writer"):
        if max_pending_bytes <= 0:
            raise ValueError(f"max_pending_bytes must be positive, got {max_pending_bytes}")
        self.max_pending_bytes = max_pending_bytes
        self._write_page = write_page
        # Queued pages, oldest first; the one being written stays here until its file is in place.
        self._pending: OrderedDict[bytes, memoryview] = OrderedDict()
        self._num_pending_bytes = 0
        self.num_dropped_pages = 0
        self._is_closing = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    @property
    def num_pending_pages(self) -> int:
        with self._changed:
            return len(self._pending)

    def put(self, page_hash: bytes, payload) -> bool:
        """Queue a page; False (dropped, counted) when it does not fit, False too when it is
        queued already. Never blocks on I/O."""
        payload_view = memoryview(payload).cast("B")
        with self._changed:
            if self._is_closing or page_hash in self._pending:
                return False
            if self._num_pending_bytes + payload_view.nbytes > self.max_pending_bytes:
                self.num_dropped_pages += 1
                return False
            self._pending[page_hash] = payload_view
            self._num_pending_bytes += payload_view.nbytes
            self._changed.notify_all()
            return True

    def pending(self, page_hash: bytes) -> memoryview | None:
        """The queued payload of ``page_hash`` (read-only use), or None."""
        with self._changed:
            return self._pending.get(page_hash)

    def flush(self) -> None:
        """Block until every page queued so far was written (or dropped)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._pending or not self._thread.is_alive())

    def close(self) -> None:
        """Write what is queued, then stop the thread. Idempotent."""
        with self._changed:
            self._is_closing = True
            self._changed.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending or self._is_closing)
                if not self._pending:
                    return  # closing, and everything is written
                page_hash, payload_view = next(iter(self._pending.items()))
            try:
                self._write_page(page_hash, payload_view)
            except Exception:  # a full disk must not stop the writer: the page is just not kept
                logger.exception("KV disk tier: writing page %s failed; dropped", page_hash.hex())
                with self._changed:
                    self.num_dropped_pages += 1
            with self._changed:
                del self._pending[page_hash]
                self._num_pending_bytes -= payload_view.nbytes
                self._changed.notify_all()

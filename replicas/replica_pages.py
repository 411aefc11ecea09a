"""A replica's own record of the pages its radix tree holds, kept from the tree's page events.

The engine thread calls `on_event` (cache/page_events.py); the replica's event loop reads a
versioned snapshot for the router. The version counts events, so a router can tell a newer
snapshot from an older one.
"""

import threading

from cache.page_events import PageEvent, PageEventKind


class ReplicaPages:
    def __init__(self):
        self._lock = threading.Lock()
        self._page_hashes: set[bytes] = set()
        self._version = 0

    def on_event(self, event: PageEvent) -> None:
        with self._lock:
            if event.kind is PageEventKind.STORED:
                self._page_hashes.update(event.page_hashes)
            elif event.kind is PageEventKind.REMOVED:
                self._page_hashes.difference_update(event.page_hashes)
            else:
                self._page_hashes.clear()
            self._version += 1

    def snapshot(self) -> tuple[int, list[bytes]]:
        with self._lock:
            return self._version, list(self._page_hashes)

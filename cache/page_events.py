"""Events the radix tree reports when its set of cached pages changes (as vLLM's KV events).

Listeners get every event synchronously, on the tree's own thread (the engine loop), so they
must be cheap and must not touch the tree. Pages are named by their chained hashes
(cache/page_hash.py), which name one exact (salt, prefix) in any process: that is what makes
the events useful outside the engine (a router's index of what each replica holds).
A split emits nothing: it changes no cached page.
"""

from collections.abc import Callable
from enum import Enum
from typing import NamedTuple


class PageEventKind(str, Enum):
    STORED = "stored"  # pages added to the tree (insert of a new run)
    REMOVED = "removed"  # pages evicted from the tree
    CLEARED = "cleared"  # every page dropped (reset); page_hashes is empty


class PageEvent(NamedTuple):
    kind: PageEventKind
    page_hashes: tuple[bytes, ...]  # root side first


PageListener = Callable[[PageEvent], None]

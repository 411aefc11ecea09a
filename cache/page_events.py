"""Events the radix tree reports when its set of cached pages changes (as vLLM's KV events).

Listeners (a replica's report to a router, the KV tier's copies) get every event synchronously, on the tree's own thread (the engine loop), so they
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


class PageEvent(NamedTuple):
    kind: PageEventKind
    page_hashes: tuple[bytes, ...]  # root side first
    # The pool slots holding those pages, valid only during the call: STORED pages are computed
    # and read-only from now on; REMOVED pages are told before they are released, so a listener
    # may still copy them (a KV tier's write-back).
    page_ids: tuple[int, ...]
    # Derived KV (cached under a DerivedSalt: document KV placed at a new position and what was
    # computed after it); its hashes carry the derived tag, so no exact lookup matches them.
    is_derived: bool = False


PageListener = Callable[[PageEvent], None]

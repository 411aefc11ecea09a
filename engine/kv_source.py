"""Sources of KV for a request's prompt beside the prefix tree's exact match, behind one contract.

Modelled on vLLM's KV connector. The scheduler admits a request by matching the tree's exact prefix
and locking it into the request (page_ids, num_tree_pages, num_computed_tokens); then it asks each
source in turn, never a feature by name:

  scheduler side (engine thread, inside Scheduler.schedule)
    waits_for(request, admitted)     side-effect free: should `request` wait, because an admitted
                                     request is computing KV this source will then supply?
    num_suppliable_tokens(request, num_matched_tokens)
                                     side-effect free: how many of the prompt's tokens past the first
                                     `num_matched_tokens` this source could supply now (an estimate:
                                     a later load may miss); longest-prefix-first admission orders by it
    admit(request, tree, max_pages)  allocate pages (tree.allocate_pages, which may evict unlocked
                                     cache), load or plan into them, and update the request's KV state
                                     (it may move the request's tree lock to a deeper node)
    count_admission(request)         on the request's first admission: count what it supplied
    release(request)                 the request leaves the pool: give back what admit took

  runner side (engine thread, around the forward pass of one step)
    load(chunks) -> chunks           before the forward pass: write planned KV into pages (may re-cut
                                     the step's chunks of the requests it loaded)
    save(chunks)                     after the forward pass and commit: keep the KV just computed

Implementations: engine/kv_tier_link.py (the disk tier: loads at admission, saves on the tree's page
events, so its runner side does nothing) and engine/document_reuse.py (the document store: plans at
admission, places and stores around the forward pass).
"""

from collections.abc import Sequence

from cache import RadixTree
from engine.request import Request


class KVSource:
    """The contract, with the do-nothing default of each call."""

    def waits_for(self, request: Request, admitted: Sequence[Request]) -> bool:
        return False

    def num_suppliable_tokens(self, request: Request, num_matched_tokens: int) -> int:
        return 0

    def admit(self, request: Request, tree: RadixTree, max_num_pages: int) -> None:
        """`max_num_pages`: max_source_pages(request)."""

    def count_admission(self, request: Request) -> None:
        pass

    def release(self, request: Request) -> None:
        pass

    def load(self, chunks: list) -> list:
        return chunks

    def save(self, chunks: list) -> None:
        pass

    def close(self) -> None:
        """Finish pending writes and let go of files. Idempotent."""


def max_source_pages(request: Request, page_size: int) -> int:
    """Pages of a request's KV the tree and sources may supply: all but its computed tail (the last
    token, whose logits sample the next, and any tail-logit rows: engine/prompt_tail_logits.py)."""
    return (request.num_tokens - max(1, request.num_tail_logit_rows)) // page_size

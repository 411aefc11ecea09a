"""Which tokens run in the next step, and where their KV goes.

Each step has a token budget. Running decodes go first (one token each, oldest
first), then chunks of prefills that are under way, then new admissions from
the waiting queue (FCFS, or longest cached prefix first); a waiting request that
shares a long uncached prefix with one still prefilling waits until that prefix is
computed and cached, rather than computing it twice, and one that needs a document
span another is computing waits until that span is stored. When the pool runs
out of pages: evict unlocked cache, then preempt the newest admitted request
(its computed pages go into the tree, so recomputing it later is mostly a
cache hit). A request that cannot fit even alone is refused in `add`.

Page ownership follows the rule in `engine/request.py`.
"""

import time
from collections import deque
from dataclasses import dataclass

from cache import DerivedSalt, LFUPolicy, LRUPolicy, PageAllocator, RadixTree
from engine.engine_config import EngineConfig
from engine.errors import RequestError
from engine.request import FinishReason, Request, RequestStatus

# Longest-prefix-first needs a match per waiting request each step; past this
# many waiting it falls back to FCFS (as SGLang does).
LPM_MAX_WAITING = 128
# A waiting request that shares at least this many uncached pages with a request still
# prefilling waits for them to be computed instead of computing them again.
MIN_SHARED_PAGES = 2


@dataclass(frozen=True)
class ScheduledChunk:
    request: Request
    start: int  # index in request.all_token_ids of the first token to compute
    num_tokens: int  # tokens computed, drafts included
    # A verify chunk (engine/speculative_verify.py): the decode's last token, then these drafts at
    # positions past the request's tokens; every row's logits are needed.
    draft_token_ids: tuple[int, ...] = ()

    @property
    def completes_request_tokens(self) -> bool:
        """True when after this chunk every known token is computed, so the
        chunk's last row (before any drafts) gives the next token's logits."""
        return self.start + self.num_tokens - len(self.draft_token_ids) == self.request.num_tokens


class Scheduler:
    def __init__(self, config: EngineConfig, num_pages: int, max_model_len: int, kv_tier=None, documents=None):
        """`kv_tier`: an engine.kv_tier_link.KVTierLink to continue matches in and copy pages to, or None.
        `documents`: an engine.document_reuse.DocumentReuse that plans stitched spans at admission, or None."""
        self.page_size = config.page_size
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        self.schedule_policy = config.schedule
        self.enable_prefix_cache = config.enable_prefix_cache
        self.max_model_len = max_model_len
        self.allocator = PageAllocator(num_pages)
        self.tree = RadixTree(self.page_size, self.allocator,
                              LFUPolicy() if config.eviction_policy == "lfu" else LRUPolicy())
        self.kv_tier = kv_tier if self.enable_prefix_cache else None
        self.documents = documents if self.enable_prefix_cache else None
        if self.kv_tier is not None:
            self.tree.page_listeners.append(self.kv_tier.on_page_event)
        self.waiting: deque[Request] = deque()
        self.admitted: list[Request] = []  # prefilling or running, in admission order
        # Counters for metrics: prompt tokens looked up in / found in the prefix cache.
        self.num_prefix_query_tokens = 0
        self.num_prefix_hit_tokens = 0
        self.num_preemptions = 0
        self.num_evicted_pages = 0

    # ---- queue ----------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a request, or raise RequestError if it can never be served."""
        if not request.prompt_token_ids:
            raise RequestError("the prompt is empty")
        max_len = len(request.prompt_token_ids) + request.sampling.params.max_tokens
        if max_len > self.max_model_len:
            raise RequestError(
                f"prompt ({len(request.prompt_token_ids)} tokens) + max_tokens "
                f"({request.sampling.params.max_tokens}) = {max_len} exceeds the model's "
                f"context length {self.max_model_len}"
            )
        if self._num_pages_for(max_len) > self.allocator.num_pages:
            raise RequestError(
                f"prompt + max_tokens = {max_len} tokens needs {self._num_pages_for(max_len)} KV "
                f"pages but the whole pool has {self.allocator.num_pages}; lower max_tokens or "
                f"give the server more --kv-cache-memory"
            )
        self.waiting.append(request)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_admitted(self) -> int:
        """Requests prefilling or decoding."""
        return len(self.admitted)

    @property
    def num_prefilling(self) -> int:
        return sum(1 for request in self.admitted if request.status is RequestStatus.PREFILLING)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.admitted)

    def find(self, request_id: str) -> Request | None:
        for request in (*self.admitted, *self.waiting):
            if request.request_id == request_id:
                return request
        return None

    # ---- one step -------------------------------------------------------

    def schedule(self) -> list[ScheduledChunk]:
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        scheduled: set[int] = set()  # id() of requests with a chunk this step

        # 1. Decodes, oldest first; each may preempt newer requests for a page.
        for request in list(self.admitted):
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:  # also skips one preempted just now
                continue
            drafts = self._draft_room(request, budget - 1)
            if self._grow(request, 1, scheduled):
                chunks.append(ScheduledChunk(request, request.num_computed_tokens, 1 + len(drafts), drafts))
                scheduled.add(id(request))
                budget -= 1 + len(drafts)

        # 2. Prefills under way, oldest first.
        for request in list(self.admitted):
            if budget == 0:
                break
            if request.status is not RequestStatus.PREFILLING:  # also skips one preempted just now
                continue
            prefill = _prefill_chunks(request, budget)
            if self._grow(request, _num_spanned_tokens(request, prefill), scheduled):
                chunks.extend(prefill)
                scheduled.add(id(request))
                budget -= sum(chunk.num_tokens for chunk in prefill)

        # 3. Admissions: only evicting cache, never preempting, to make room.
        spans_in_flight = None  # gathered at the first request that could wait for a span
        for request in self._admission_order():
            if budget == 0 or len(self.admitted) >= self.max_num_seqs:
                break
            if self._waits_for_shared_prefix(request):
                continue
            if self.documents is not None and self.documents.is_on(request):  # it may wait for a span
                if spans_in_flight is None:
                    spans_in_flight = self.documents.spans_in_flight(self.admitted)
                if self.documents.waits_for_spans(request, spans_in_flight):
                    continue
            self._admit(request)
            prefill = _prefill_chunks(request, budget)
            pages = self._allocate(self._num_new_pages(request, _num_spanned_tokens(request, prefill)))
            if pages is None:
                self._release(request, insert=False)
                request.status = RequestStatus.WAITING
                break  # head-of-line: later requests would not fit either
            request.page_ids.extend(pages)
            self._count_admission(request)
            self.waiting.remove(request)
            self.admitted.append(request)
            if spans_in_flight is not None:
                spans_in_flight.add(request)
            chunks.extend(prefill)
            scheduled.add(id(request))
            budget -= sum(chunk.num_tokens for chunk in prefill)
        return chunks

    def commit(self, chunks: list[ScheduledChunk]) -> None:
        """After the forward pass: the chunks' KV is in pages."""
        for chunk in chunks:
            request = chunk.request
            request.advance_computed(chunk.start + chunk.num_tokens)  # past stitched runs, if any
            is_prefill_chunk = request.status is RequestStatus.PREFILLING
            if is_prefill_chunk and chunk.completes_request_tokens:
                request.status = RequestStatus.RUNNING
            if self.enable_prefix_cache and is_prefill_chunk:
                # Share finished prefill pages (the prompt's last chunk too) at once with concurrent requests.
                self._insert_computed(request)

    def discard_rejected(self, request: Request, num_rejected: int) -> None:
        """After verifying a chunk's drafts: the last `num_rejected` computed tokens were not
        accepted. Their KV is dropped (never counted, never inserted into the tree) and pages
        past the request's tokens go back to the pool."""
        request.num_computed_tokens -= num_rejected
        num_kept_pages = max(request.num_tree_pages, self._num_pages_for(request.num_tokens))
        self.allocator.release(request.page_ids[num_kept_pages:])
        del request.page_ids[num_kept_pages:]

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Retire an admitted or waiting request; its pages go to the tree or back to the pool."""
        if request in self.admitted:
            self.admitted.remove(request)
            self._release(request, insert=True)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.finish_reason = reason
        request.status = RequestStatus.ABORTED if reason is FinishReason.ABORT else RequestStatus.FINISHED

    # ---- pages ----------------------------------------------------------

    def _num_pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def _num_new_pages(self, request: Request, num_tokens: int) -> int:
        needed = self._num_pages_for(request.num_computed_tokens + num_tokens)
        return max(0, needed - len(request.page_ids))

    def _allocate(self, num_pages: int) -> list[int] | None:
        if num_pages == 0:
            return []
        shortfall = num_pages - self.allocator.num_free_pages
        if shortfall > 0:
            self.num_evicted_pages += self.tree.evict(shortfall)
        if self.allocator.num_free_pages < num_pages:
            return None
        return self.allocator.allocate(num_pages)

    def _grow(self, request: Request, num_tokens: int, scheduled: set[int]) -> bool:
        """Give an admitted request pages for `num_tokens` more tokens,
        preempting newer unscheduled requests if need be. False if the request
        itself had to be preempted."""
        num_pages = self._num_new_pages(request, num_tokens)
        while (pages := self._allocate(num_pages)) is None:
            victim = next((r for r in reversed(self.admitted) if id(r) not in scheduled), None)
            if victim is None:
                return False
            self._preempt(victim)
            if victim is request:
                return False
        request.page_ids.extend(pages)
        return True

    def _draft_room(self, request: Request, max_drafts: int) -> tuple[int, ...]:
        """The request's drafts that fit the budget and free pages (drafts never evict cache
        or preempt anyone); their pages are allocated here."""
        drafts = tuple(request.draft_token_ids[:max(0, max_drafts)])
        if not drafts:
            return ()
        num_pages = self._num_new_pages(request, 1 + len(drafts))
        if num_pages > self.allocator.num_free_pages:
            return ()
        request.page_ids.extend(self.allocator.allocate(num_pages) if num_pages else [])
        return drafts

    def _preempt(self, request: Request) -> None:
        self.admitted.remove(request)
        self._release(request, insert=True)
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    # ---- prefix cache ---------------------------------------------------

    def _admission_order(self) -> list[Request]:
        waiting = list(self.waiting)
        if self.schedule_policy != "lpm" or not self.enable_prefix_cache or len(waiting) > LPM_MAX_WAITING:
            return waiting
        hits = {id(r): self.tree.match_prefix(r.all_token_ids, r.cache_salt).num_tokens for r in waiting}
        return sorted(waiting, key=lambda r: -hits[id(r)])  # stable: FCFS among equals

    def _admit(self, request: Request) -> None:
        """Match the cached prefix and lock it. At least one token is left to
        compute: its logits give the next token."""
        request.status = RequestStatus.PREFILLING
        tokens = request.all_token_ids
        if request.needs_prompt_logprobs:
            # Cached tokens have no logits: compute the whole prompt (again, after a preemption).
            request.prompt_logprobs, request.prompt_top_logprobs = [], []
            return
        if not self.enable_prefix_cache:
            return
        match = self.tree.match_prefix(tokens, request.cache_salt)
        # the last token (its logits) and tail-logit rows (engine/prompt_tail_logits.py) are computed
        max_num_pages = (len(tokens) - max(1, request.num_tail_logit_rows)) // self.page_size
        if self.kv_tier is not None:
            num_loaded_before = self.kv_tier.num_hit_tokens
            match = self.kv_tier.extend_match(self.tree, self.allocator, self._allocate, tokens,
                                              request.cache_salt, match, max_num_pages)
            if request.timings.first_scheduled is None:  # counted at the first admission, as cached tokens are
                request.num_disk_tier_tokens = self.kv_tier.num_hit_tokens - num_loaded_before
        num_pages = min(len(match.page_ids), max_num_pages)
        self.tree.lock(match.last_node)
        request.tree_node = match.last_node
        request.page_ids = list(match.page_ids[:num_pages])
        request.num_tree_pages = num_pages
        request.num_computed_tokens = num_pages * self.page_size
        if self.documents is not None:
            self.documents.plan(request, self.tree, self._allocate, max_num_pages)

    def _waits_for_shared_prefix(self, request: Request) -> bool:
        """True when a request still prefilling shares at least MIN_SHARED_PAGES more full pages
        with `request` than the tree holds, and has not computed them yet: admitting `request`
        now would compute the same prefix twice; a step or two later it is a cache hit (each
        prefill chunk goes into the tree when it is done). Requests arriving together with one
        long system prompt are the common case."""
        if not self.enable_prefix_cache or request.needs_prompt_logprobs:
            return False
        prefilling = [other for other in self.admitted
                      if other.status is RequestStatus.PREFILLING and other.cache_salt == request.cache_salt]
        if not prefilling:
            return False
        tokens = request.all_token_ids
        num_cached_pages = None
        for other in prefilling:
            num_shared_pages = _num_shared_pages(tokens, other.prompt_token_ids, self.page_size)
            if num_shared_pages * self.page_size <= other.num_computed_tokens:
                continue  # already computed: in the tree
            if num_cached_pages is None:
                num_cached_pages = self.tree.match_prefix(tokens, request.cache_salt).num_tokens // self.page_size
            if num_shared_pages - num_cached_pages >= MIN_SHARED_PAGES:
                return True
        return False

    def _count_admission(self, request: Request) -> None:
        if request.timings.first_scheduled is not None:
            return  # a preempted request coming back: counted the first time
        request.timings.first_scheduled = time.perf_counter()
        request.num_cached_tokens = min(request.num_computed_tokens, len(request.prompt_token_ids))
        self.num_prefix_query_tokens += len(request.prompt_token_ids)
        self.num_prefix_hit_tokens += request.num_cached_tokens
        if self.documents is not None:  # + the prompt tokens placed from the document store
            self.documents.count_admission(request)

    def _insert_computed(self, request: Request) -> None:
        num_full_pages = request.num_computed_tokens // self.page_size
        if num_full_pages == 0:
            return
        tokens = request.all_token_ids[: num_full_pages * self.page_size]
        # Pages from the first derived position on (stitched document KV and all computed after it)
        # are cached under the derived key only: the exact key keeps only exactly computed KV.
        derived_salt = num_exact_pages = None
        if request.num_exact_tokens is not None:
            derived_salt, num_exact_pages = DerivedSalt(request.cache_salt), request.num_exact_tokens // self.page_size
        self.tree.insert(tokens, request.page_ids[:num_full_pages], request.cache_salt, derived_salt, num_exact_pages)
        # Lock the longer path instead: nodes whose pages this request uses
        # are not worth evicting (evicting them would free nothing).
        match = self.tree.match_prefix(tokens, request.cache_salt, derived_salt, num_exact_pages)
        self.tree.lock(match.last_node)
        if request.tree_node is not None:
            self.tree.unlock(request.tree_node)
        request.tree_node = match.last_node

    def _release(self, request: Request, insert: bool) -> None:
        """Drop the request's KV state: insert its computed pages into the tree
        (when asked and caching), unlock, release its own pages exactly once."""
        if insert and self.enable_prefix_cache:
            self._insert_computed(request)
        if request.tree_node is not None:
            self.tree.unlock(request.tree_node)
        self.allocator.release(request.page_ids[request.num_tree_pages :])
        if self.documents is not None:
            self.documents.release(request)  # store references of copies not placed yet; replanned on return
        request.page_ids = []
        request.stitched_runs = []
        request.num_exact_tokens = None
        request.num_tree_pages = 0
        request.tree_node = None
        request.num_computed_tokens = 0


def _prefill_chunks(request: Request, budget: int) -> list[ScheduledChunk]:
    """The request's next prefill chunks within `budget`: one, or one per range between stitched runs."""
    return [ScheduledChunk(request, start, num_tokens) for start, num_tokens in request.next_compute_ranges(budget)]


def _num_spanned_tokens(request: Request, chunks: list[ScheduledChunk]) -> int:
    """Tokens from num_computed_tokens to the end of the last chunk (stitched runs between included):
    what the request's pages must cover after this step."""
    return chunks[-1].start + chunks[-1].num_tokens - request.num_computed_tokens


def _num_shared_pages(a: list[int], b: list[int], page_size: int) -> int:
    """Full pages at the start of `a` and `b` that are equal (compared a page at a time)."""
    num_pages = min(len(a), len(b)) // page_size
    for page in range(num_pages):
        start = page * page_size
        if a[start:start + page_size] != b[start:start + page_size]:
            return page
    return num_pages

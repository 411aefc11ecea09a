"""Document KV reuse at admission: which prompt spans come from the document store, which tokens
the request still computes, and where its KV stops being exact.

After the radix tree's exact prefix match (P tokens), for a request with reuse on:
1. Derived continuation: pages cached under the tenant's DerivedSalt below the exact match (a
   stitched prefix an earlier request left, e.g. the previous turn or choice 0 of n) are taken too.
2. Spans: cache.document_spans.find_spans(prompt, options.document_spans, min_span_tokens, breaks). Each
   span at or after the matched prefix whose KV is stored (same tokens, same salt) is placed into
   the request's pages (engine/document_kv_copy.py: K re-rotated by new start - stored start, V as
   is), except its first k = document_boundary_tokens tokens, which are recomputed (a span computed
   alone learned an attention sink at its start), unless the span directly follows the span it was
   originally computed after (the stored predecessor key): that junction is as it was computed.
   A span the tree's pages end inside (they hold whole pages) places its rows from there on.
   A precomputed span also keeps the last NUM_LEAD_TOKENS tokens of the context it was computed
   after (DocumentEntry.lead_ids); as many of them as the prompt holds right before the span are
   placed with it, and the k recomputed tokens are then the first of those.
3. The request then computes only what is not placed: boundary tokens, spans never stored, and
   everything after the last placed run (the last prompt token and tail-logit rows always). Its
   ranges run as chunks attending causally to all KV before them (Request.next_compute_ranges).
4. Exactness: KV from the first placed position on (and everything computed after it) is derived;
   Request.num_exact_tokens makes the scheduler cache those pages under the derived key only.
5. Optional selective recompute (engine/selective_recompute.py, DocumentReuseConfig.recompute_fraction):
   after placement, the placed tokens whose KV deviates most in this context leave the stitched runs
   and are recomputed too; count_selective_recompute moves them from reused to computed.
6. Store fill: spans that missed the store (and start at or after Request.document_store_start)
   are copied from the request's pages into it once its prefill is done (with their position and
   predecessor key): spans pay once.

As a KV source (engine/kv_source.py): steps 1-3 are `admit` (scheduler side), placement and step 5
`load` and step 6 `save` (runner side, around the forward pass, with engine/document_kv_copy.py).
"""

from dataclasses import dataclass, field

from cache import DerivedSalt, RadixTree
from cache.document_spans import SpanBreaks, find_spans
from cache.document_store import DocumentEntry, DocumentKey, DocumentKVStore, document_key
from engine.engine_config import EngineConfig
from engine.kv_source import KVSource
from engine.request import Request


@dataclass(frozen=True)
class SpanCopy:
    """Rows [source_start, source_start + num_tokens) of a stored entry, placed at positions
    [start, start + num_tokens) of the request; K re-rotated by `delta` positions."""

    entry: DocumentEntry
    source_start: int
    start: int
    num_tokens: int
    delta: int


# A span precomputed after a context keeps this many of the context's last tokens (the documents
# block's markup before it, `<document id="...">`): a prompt with the same tokens before the span
# places them too. Markup of a few tokens is no span of its own, and would be computed every time.
NUM_LEAD_TOKENS = 32


@dataclass(frozen=True)
class SpanToStore:
    start: int
    end: int
    predecessor: DocumentKey | None  # the span directly before it in this prompt, if adjacent
    num_lead_tokens: int = 0  # tokens before `start` stored with it (DocumentEntry.lead_ids)


@dataclass
class DocumentPlan:
    copies: list[SpanCopy] = field(default_factory=list)  # holds a store reference each until placed
    to_store: list[SpanToStore] = field(default_factory=list)
    num_reused_spans: int = 0
    num_reused_tokens: int = 0  # placed and not recomputed
    num_recomputed_tokens: int = 0  # tokens of reused spans recomputed (boundaries, the prompt's end)
    num_derived_prefix_tokens: int = 0  # taken from the tree's derived continuation
    is_counted: bool = False  # counted by count_admission (a request's first admission only)


class SpansInFlight:
    """Token ids of the spans admitted requests are computing to store, per cache salt. The scheduler
    builds it once per step, at the first request that could wait, and adds each request it admits
    after that, so a queue of waiting requests does not gather it once each."""

    def __init__(self):
        self._spans: set[tuple] = set()  # (cache salt, token ids)

    def add(self, request: Request) -> None:
        plan = request.document_plan
        if isinstance(plan, DocumentPlan):
            prompt = request.prompt_token_ids
            self._spans.update((request.cache_salt, tuple(prompt[span.start:span.end])) for span in plan.to_store)

    def has(self, cache_salt, token_ids: list[int]) -> bool:
        return (cache_salt, tuple(token_ids)) in self._spans

    def __bool__(self) -> bool:
        return bool(self._spans)


class DocumentReuse(KVSource):
    """The document store as a KV source: plans stitched spans at admission, places and stores them
    around the forward pass; counts what reuse saved."""

    def __init__(self, config: EngineConfig, store: DocumentKVStore, breaks: SpanBreaks, copier=None,
                 selective=None):
        """`breaks`: the tokenizer's newline and special tokens, where span cuts prefer to fall.
        `copier`: engine/document_kv_copy.py's DocumentKVCopier (the runner side's tensor copies; None:
        plans only). `selective`: engine/selective_recompute.py's SelectiveRecompute, or None (off)."""
        self.copier = copier
        self.selective = selective
        self.default_on = config.documents.enabled
        self.boundary_tokens = config.documents.boundary_tokens
        self.min_span_tokens = config.documents.min_span_tokens
        self.breaks = breaks
        self.page_size = config.page_size
        self.store = store
        self.num_reused_spans = 0
        self.num_reused_tokens = 0
        self.num_recomputed_tokens = 0  # boundary and selectively recomputed tokens of reused spans
        self.num_selectively_recomputed_tokens = 0  # of those, chosen by engine/selective_recompute.py

    def is_on(self, request: Request) -> bool:
        """Reuse for this request: its option, else the engine's default; never with prompt logprobs
        (every prompt row must be computed then)."""
        wanted = request.options.document_reuse
        return (self.default_on if wanted is None else wanted) and request.sampling.params.prompt_logprobs is None

    def waits_for(self, request: Request, admitted) -> bool:
        """KVSource: a span of `request` is being computed by an admitted request (waits_for_spans)."""
        return self.is_on(request) and self.waits_for_spans(request, self.spans_in_flight(admitted))

    def num_suppliable_tokens(self, request: Request, num_matched_tokens: int) -> int:
        """KVSource: tokens past `num_matched_tokens` in spans the store holds (before boundary recompute)."""
        if not self.is_on(request):
            return 0
        prompt = request.prompt_token_ids
        return sum(end - max(start, num_matched_tokens) for start, end in self._spans_of(request)
                   if end > num_matched_tokens and document_key(prompt[start:end], request.cache_salt) in self.store)

    def admit(self, request: Request, tree: RadixTree, max_num_pages: int) -> None:
        """KVSource: after the exact match set request.page_ids (tree pages only) and num_computed_tokens:
        extend it with derived pages, choose the spans to place, allocate their pages (tree.allocate_pages)
        and set request.stitched_runs, num_exact_tokens and document_plan."""
        request.document_plan = None
        if not self.is_on(request):
            return
        plan = DocumentPlan()
        self._take_derived_prefix(request, tree, max_num_pages, plan)
        prompt = request.prompt_token_ids
        # the last prompt token (its logits sample) and tail-logit rows are always computed
        end_limit = len(prompt) - max(1, request.num_tail_logit_rows)
        prefix_end = request.num_computed_tokens
        previous: tuple[int, DocumentKey] | None = None  # (end, key) of the span before
        store_start = request.document_store_start
        for start, end in self._spans_of(request):
            key = document_key(prompt[start:end], request.cache_salt)
            adjacent_key = previous[1] if previous is not None and previous[0] == start else None
            lead_floor = max(prefix_end, previous[0] if previous is not None else 0)  # leads cover gaps only
            previous = (end, key)
            # wholly in the pages from the tree already: only whether it is stored matters
            entry = None if end <= prefix_end else self.store.lookup(key)  # memory, else its disk copy
            if entry is None:
                if start >= store_start and (start >= prefix_end or key not in self.store):
                    num_lead = min(NUM_LEAD_TOKENS, start) if start == store_start else 0
                    plan.to_store.append(SpanToStore(start, end, adjacent_key, num_lead))
                continue
            if start < prefix_end:
                # The tree's pages end inside the span (they hold whole pages only; the prompt
                # diverges within its last page): the span's head is in the pages already, computed
                # in this prompt, so no head of it is placed and there is no boundary to recompute;
                # its stored rows go on from there (derived KV like any placed run).
                span_start = run_start = prefix_end
            else:
                follows_its_predecessor = entry.predecessor is not None and entry.predecessor == adjacent_key
                span_start = start - _num_matching_lead(entry.lead_ids, prompt, start, lead_floor)
                run_start = span_start + (0 if follows_its_predecessor else self.boundary_tokens)
            run_end = min(end, end_limit)
            if run_start >= run_end:
                continue
            self.store.acquire(entry)  # now: a later span's load from disk must not evict it
            source_start = len(entry.lead_ids) - (start - span_start) + (run_start - span_start)  # its row in kv
            plan.copies.append(SpanCopy(entry, source_start, run_start, run_end - run_start, start - entry.position))
            plan.num_reused_spans += 1
            plan.num_reused_tokens += run_end - run_start
            plan.num_recomputed_tokens += (end - span_start) - (run_end - run_start)
        if plan.copies and not self._allocate_pages(request, plan, tree):
            for copy in plan.copies:
                self.store.release(copy.entry)
            plan.copies, plan.num_reused_spans, plan.num_reused_tokens, plan.num_recomputed_tokens = [], 0, 0, 0
        request.stitched_runs = [(copy.start, copy.start + copy.num_tokens) for copy in plan.copies]
        if plan.copies and request.num_exact_tokens is None:
            request.num_exact_tokens = plan.copies[0].start
        request.document_plan = plan

    def spans_in_flight(self, admitted: list[Request]) -> "SpansInFlight":
        """The spans admitted requests are computing now and will store (their plans' spans to store)."""
        spans = SpansInFlight()
        for other in admitted:
            spans.add(other)
        return spans

    def waits_for_spans(self, request: Request, in_flight: "SpansInFlight") -> bool:
        """True when a span of `request` that the store lacks is being computed right now by an
        admitted request still prefilling (same salt; in its plan's spans to store): admitting
        `request` now would compute it twice; once that request has computed it (its prefill goes
        first, and DocumentKVCopier.fill stores each span as soon as it is computed) it is a store
        hit. Bounded: it waits only on admitted requests, which never wait, and only until they have
        computed the span, leave, or are preempted. For a request with reuse on (is_on)."""
        if not in_flight:
            return False
        prompt = request.prompt_token_ids
        return any(in_flight.has(request.cache_salt, prompt[start:end])
                   and document_key(prompt[start:end], request.cache_salt) not in self.store
                   for start, end in self._spans_of(request))

    def _spans_of(self, request: Request) -> list[tuple[int, int]]:
        """find_spans of the request's prompt, found once (the prompt never changes, waiting or not)."""
        if request.found_spans is None:
            request.found_spans = find_spans(request.prompt_token_ids, request.options.document_spans,
                                             self.min_span_tokens, self.breaks)
        return request.found_spans

    def _take_derived_prefix(self, request: Request, tree: RadixTree, max_num_pages: int,
                             plan: DocumentPlan) -> None:
        """Continue the exact match into the tenant's derived pages, if they go further."""
        num_exact_pages = request.num_tree_pages
        if num_exact_pages >= max_num_pages:
            return
        match = tree.match_prefix(request.all_token_ids, request.cache_salt, DerivedSalt(request.cache_salt),
                                  max_exact_pages=num_exact_pages)
        num_pages = min(len(match.page_ids), max_num_pages)
        if num_pages <= num_exact_pages:
            return
        tree.lock(match.last_node)
        tree.unlock(request.tree_node)
        request.tree_node = match.last_node
        request.page_ids = list(match.page_ids[:num_pages])
        request.num_tree_pages = num_pages
        request.num_computed_tokens = num_pages * self.page_size
        request.num_exact_tokens = num_exact_pages * self.page_size
        plan.num_derived_prefix_tokens = (num_pages - num_exact_pages) * self.page_size

    def _allocate_pages(self, request: Request, plan: DocumentPlan, tree: RadixTree) -> bool:
        """Pages up to the last placed run's end; False (nothing taken) when the pool has none."""
        last = plan.copies[-1]
        num_pages = -(-(last.start + last.num_tokens) // self.page_size) - len(request.page_ids)
        pages = tree.allocate_pages(num_pages) if num_pages > 0 else []
        if pages is None:
            return False
        request.page_ids.extend(pages)
        return True

    def release(self, request: Request) -> None:
        """The request leaves the pool (finished, aborted, preempted): copies not placed yet give
        their store references back (a preempted request plans again when it returns)."""
        plan = request.document_plan
        if plan is None:
            return
        for copy in plan.copies:
            self.store.release(copy.entry)
        plan.copies = []

    def count_admission(self, request: Request) -> None:
        """On a request's first admission: its placed tokens count as not computed for it."""
        plan = request.document_plan
        if plan is None:
            return
        request.num_reused_document_tokens = plan.num_reused_tokens
        request.num_cached_tokens += plan.num_reused_tokens
        request.num_recomputed_document_tokens = plan.num_recomputed_tokens
        self.num_reused_spans += plan.num_reused_spans
        self.num_reused_tokens += plan.num_reused_tokens
        self.num_recomputed_tokens += plan.num_recomputed_tokens
        plan.is_counted = True

    def load(self, chunks: list) -> list:
        """KVSource, before the forward pass: stored spans into the pages of requests admitted with them;
        with selective recompute, those requests' chunks gain the tokens it chooses."""
        if self.copier is None:
            return chunks
        placed = self.copier.place(chunks)
        if self.selective is None or not placed:
            return chunks
        chunks, chosen = self.selective.recompute(chunks, placed)
        for request, num_tokens in chosen:
            self.count_selective_recompute(request, num_tokens)
        return chunks

    def save(self, chunks: list) -> None:
        """KVSource, after the forward pass: spans that missed the store, from prefills done this step."""
        if self.copier is not None:
            self.copier.fill(chunks)

    def count_selective_recompute(self, request: Request, num_tokens: int) -> None:
        """`num_tokens` placed tokens are recomputed after all (engine/selective_recompute.py): they
        count as computed for the request; counted once, on the admission count_admission counted."""
        plan = request.document_plan
        if not isinstance(plan, DocumentPlan) or not plan.is_counted:
            return
        request.num_reused_document_tokens -= num_tokens
        request.num_cached_tokens -= num_tokens
        request.num_recomputed_document_tokens += num_tokens
        self.num_reused_tokens -= num_tokens
        self.num_recomputed_tokens += num_tokens
        self.num_selectively_recomputed_tokens += num_tokens


def _num_matching_lead(lead_ids: tuple[int, ...], prompt: list[int], start: int, floor: int) -> int:
    """How many of the entry's lead tokens the prompt holds right before `start` (never before `floor`)."""
    num = 0
    while num < len(lead_ids) and start - num - 1 >= floor and lead_ids[-1 - num] == prompt[start - num - 1]:
        num += 1
    return num

"""A request's life inside the engine: its tokens, its pages, its state.

Page ownership (the invariant the scheduler keeps):
- `page_ids[:num_tree_pages]` belong to the radix tree and are protected by the
  lock this request holds on `tree_node`; the request holds no reference on them.
- `page_ids[num_tree_pages:]` were allocated for this request; it holds one
  reference on each and releases them exactly once, when it finishes, is
  aborted or is preempted (some of them may also have been inserted into the
  tree by then, which then holds its own reference).
"""

import time
from dataclasses import dataclass, field
from enum import Enum

from engine.request_options import DEFAULT_REQUEST_OPTIONS, RequestOptions
from engine.sampler import SamplingState


class RequestStatus(Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to be recomputed
    PREFILLING = "prefilling"  # admitted, prompt partly in KV
    RUNNING = "running"  # prompt in KV, decoding one token a step
    FINISHED = "finished"
    ABORTED = "aborted"


class FinishReason(str, Enum):
    STOP = "stop"  # a stop token (EOS or a requested one)
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # aborted by the client or refused


@dataclass
class Timings:
    """Monotonic seconds (time.perf_counter) of the moments that latency metrics use."""

    arrival: float = field(default_factory=time.perf_counter)
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingState
    cache_salt: str | None = None  # the tenant's salt (None is a salt too): tenants share KV only with the same one
    options: RequestOptions = DEFAULT_REQUEST_OPTIONS
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    timings: Timings = field(default_factory=Timings)

    # KV state, valid while admitted (PREFILLING or RUNNING).
    page_ids: list[int] = field(default_factory=list)
    num_tree_pages: int = 0  # leading pages owned by the tree (see module docstring)
    tree_node: object | None = None  # locked radix-tree node, or None
    num_computed_tokens: int = 0  # tokens of all_token_ids whose KV is in page_ids
    num_cached_tokens: int = 0  # prompt tokens not computed for it: prefix cache + documents (first admission)
    num_reused_document_tokens: int = 0  # of those, tokens placed from the document store
    num_disk_tier_tokens: int = 0  # of num_cached_tokens, tokens the disk tier loaded into the tree for it
    num_recomputed_document_tokens: int = 0  # tokens of reused document spans computed after all (boundaries)
    num_draft_tokens: int = 0  # speculation: draft tokens verified for it
    num_accepted_draft_tokens: int = 0  # of those, accepted
    # The generated tokens, owned here: the engine appends each one; the sampling state reads it.
    output_token_ids: list[int] = field(default_factory=list)
    # With params.prompt_logprobs: entry t scores prompt token t + 1 (the first token has none).
    # Filled as prefill chunks run; complete when it has len(prompt_token_ids) - 1 entries.
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # Document reuse (engine/document_reuse.py): runs [start, end) of all_token_ids at or after
    # num_computed_tokens whose KV is already placed in page_ids (stitched from the document store),
    # sorted; where the request's KV stops being exact (None: all exact), which decides the key its
    # pages are cached under (cache/radix_tree.py); the admission plan (copies, spans to store).
    stitched_runs: list[tuple[int, int]] = field(default_factory=list)
    num_exact_tokens: int | None = None
    document_plan: object | None = None
    # Spans starting before this position are not stored (LLMEngine.precompute_documents: the context
    # a document is computed after is not a document).
    document_store_start: int = 0
    found_spans: list[tuple[int, int]] | None = None  # find_spans of the prompt, once found (it never changes)
    # With num_tail_logit_rows = n (engine/prompt_tail_logits.py): position -> (V,) float32 logits of
    # prompt positions len - n .. len - 1, recorded as prefill runs; those positions are never cached.
    num_tail_logit_rows: int = 0
    tail_logits: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.sampling.output_token_ids is not self.output_token_ids:
            raise ValueError("the sampling state must read the request's own output_token_ids list")

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building the whole concatenation
        (the runner asks for one decode token of a long prompt every step)."""
        prompt, output = self.prompt_token_ids, self.output_token_ids
        if end <= len(prompt):
            return prompt[start:end]
        if start >= len(prompt):
            return output[start - len(prompt) : end - len(prompt)]
        return prompt[start:] + output[: end - len(prompt)]

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Asked for prompt logprobs and not all computed yet: its prompt must be computed
        without the prefix cache (cached tokens have no logits)."""
        return (self.sampling.params.prompt_logprobs is not None
                and len(self.prompt_logprobs) < len(self.prompt_token_ids) - 1)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to go through the model before the next token can be sampled."""
        num_stitched = sum(end - start for start, end in self.stitched_runs)
        return self.num_tokens - self.num_computed_tokens - num_stitched

    def next_compute_ranges(self, budget: int) -> list[tuple[int, int]]:
        """(start, num_tokens) of the next ranges to compute, within `budget` tokens, in order:
        from num_computed_tokens on, skipping stitched runs. Each range is a chunk attending
        causally to all KV before it in the pages, so several may run in one step."""
        ranges: list[tuple[int, int]] = []
        position, runs = self.num_computed_tokens, iter(self.stitched_runs)
        run = next(runs, None)
        while budget > 0 and position < self.num_tokens:
            end = run[0] if run is not None else self.num_tokens
            num_tokens = min(end - position, budget)
            if num_tokens > 0:
                ranges.append((position, num_tokens))
                budget -= num_tokens
                position += num_tokens
            if run is not None and position >= end:
                position, run = run[1], next(runs, None)
        return ranges

    def advance_computed(self, end: int) -> None:
        """The KV of every position before `end` is in the pages now (past any stitched run that starts there)."""
        self.num_computed_tokens = end
        while self.stitched_runs and self.stitched_runs[0][0] <= self.num_computed_tokens:
            self.num_computed_tokens = max(self.num_computed_tokens, self.stitched_runs.pop(0)[1])

    @property
    def is_finished(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.ABORTED)


@dataclass(frozen=True)
class RequestOutput:
    """What one engine step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    logprobs: list[float] | None  # chosen tokens' logprobs, when asked
    top_logprobs: list[list[tuple[int, float]]] | None
    finish_reason: FinishReason | None  # set on the request's last output
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens whose KV was not computed for this request (prefix cache + documents)
    num_output_tokens: int
    # With params.prompt_logprobs, on the request's first output only: one entry per prompt
    # token, None for the first (nothing precedes it); top alternatives likewise.
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None
    # Of num_cached_tokens, the prompt tokens whose KV came from the document store (not recomputed).
    num_reused_document_tokens: int = 0
    # Of num_cached_tokens, the prompt tokens the disk tier loaded (the tree's match continued there).
    num_disk_tier_tokens: int = 0
    # Prompt tokens of reused document spans that were computed after all (span boundaries, selective
    # recompute): not in num_cached_tokens.
    num_recomputed_document_tokens: int = 0
    # Speculation, so far: draft tokens verified for this request, and how many were accepted.
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0

"""Draft tokens without a draft model: prompt lookup and a cross-request suffix index.

Each step, every running request that speculates gets up to k draft tokens: the tokens that
followed earlier occurrences of its last tokens, in its own prompt + output (prompt lookup,
mode "ngram") and also in recent finished requests' prompts and outputs (mode "suffix", a
bounded SuffixIndex; SuffixDecoding's idea). Occurrences that repeat the most of the last
tokens win; among those the draft follows the continuation most of them agree on, token by
token, and stops where they disagree (`choose_draft`).

k adapts per request (`DraftLength`): from its estimated acceptance rate and what a chunk of
1 + k rows costs on the backend, the k that emits the most tokens per unit of cost, or none
(then COOLDOWN_STEPS steps without drafts), so text that does not copy (plain chat) pays for
few rejected rows.
"""

from collections import Counter
from dataclasses import dataclass, field

from engine.draft_index import Continuation, SequenceNgrams, SuffixIndex

DEFAULT_MAX_DRAFT_TOKENS = 4
DEFAULT_SUFFIX_INDEX_TOKENS = 200_000  # cross-request tokens kept (~2 MB of ids plus the index)
COOLDOWN_STEPS = 8  # steps without drafts once drafting does not pay
INITIAL_ACCEPTANCE = 0.7  # a request's acceptance estimate before its first verify
ACCEPTANCE_WEIGHT = 0.3  # of the newest verify in the estimate
# A draft continues past a token only while at least this share of the candidates agree on it.
MIN_AGREEMENT = 0.5


@dataclass
class DraftLength:
    """A request's adaptive draft length.

    Drafts are modelled as accepted one after another with probability `acceptance` each (estimated
    per request, exponentially weighted): k drafts then emit (1 - a^(k+1)) / (1 - a) tokens for a step
    that costs row_costs[k] (the backend's StepPolicy.verify_row_costs). k is the one that emits the
    most per unit of cost, 0 when none beats a plain decode; after a k of 0 the request waits
    COOLDOWN_STEPS steps, then probes with one draft so that its estimate can recover."""

    max_tokens: int
    row_costs: tuple[float, ...] = (1.0,) * 9
    acceptance: float = INITIAL_ACCEPTANCE
    num_cooldown_steps: int = 0  # steps left without drafts
    is_probing: bool = False  # the cooldown is over: the next proposal is one draft

    def next_k(self) -> int:
        """k for this step (0 during a cooldown, which this call counts down)."""
        if self.num_cooldown_steps > 0:
            self.num_cooldown_steps -= 1
            self.is_probing = self.num_cooldown_steps == 0
            return 0
        if self.is_probing:
            return 1
        k = best_draft_length(self.acceptance, self.row_costs, self.max_tokens)
        if k == 0:
            self.num_cooldown_steps = COOLDOWN_STEPS
        return k

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            return
        self.is_probing = False
        # accepted tokens are successes; the first rejection (if any) one failure
        observed = num_accepted / (num_accepted + (num_accepted < num_drafted))
        self.acceptance += ACCEPTANCE_WEIGHT * (observed - self.acceptance)


def best_draft_length(acceptance: float, row_costs: tuple[float, ...], max_tokens: int) -> int:
    """The k in 0..max_tokens (and the cost table) with the most expected tokens per unit of step cost."""
    a = min(acceptance, 0.999)
    best_k, best_rate = 0, 1.0
    for k in range(1, min(max_tokens, len(row_costs) - 1) + 1):
        rate = (1 - a ** (k + 1)) / (1 - a) / row_costs[k]
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


@dataclass
class RequestDrafts:
    """The proposer's state for one request (Request.draft_state)."""

    length: DraftLength
    own: SequenceNgrams = field(default_factory=SequenceNgrams)


def choose_draft(continuations: list[Continuation], max_tokens: int) -> list[int]:
    """Up to max_tokens ids: the longest-matching continuations, followed while most agree.
    Ties go to the earlier continuation in the list (callers list the most recent first)."""
    if not continuations or max_tokens <= 0:
        return []
    best = max(c.match_len for c in continuations)
    candidates = [c for c in continuations if c.match_len == best]
    draft: list[int] = []
    for offset in range(max_tokens):
        counts = Counter(c.tokens[c.start + offset] for c in candidates if c.start + offset < len(c.tokens))
        if not counts:
            break
        token_id, count = counts.most_common(1)[0]  # most_common keeps first-seen order among ties
        if count < MIN_AGREEMENT * len(candidates):
            break
        draft.append(token_id)
        candidates = [c for c in candidates
                      if c.start + offset < len(c.tokens) and c.tokens[c.start + offset] == token_id]
    return draft


class DraftProposer:
    """Proposes drafts for requests and learns from finished ones (mode "ngram" or "suffix")."""

    def __init__(self, mode: str, max_draft_tokens: int = DEFAULT_MAX_DRAFT_TOKENS,
                 suffix_index_tokens: int = DEFAULT_SUFFIX_INDEX_TOKENS, row_costs: tuple[float, ...] = (1.0,) * 9):
        """`row_costs`: the backend's StepPolicy.verify_row_costs."""
        if mode not in ("ngram", "suffix"):
            raise ValueError(f"a draft proposer's mode is 'ngram' or 'suffix', got {mode!r}")
        if max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be >= 1, got {max_draft_tokens}")
        self.mode = mode
        self.max_draft_tokens = max_draft_tokens
        self.row_costs = row_costs
        self.suffix_index = SuffixIndex(suffix_index_tokens) if mode == "suffix" else None

    def propose(self, request, max_tokens: int) -> list[int]:
        """Draft ids for `request` (an engine Request): at most max_tokens, fewer per its DraftLength."""
        state = request.draft_state
        if state is None:
            state = request.draft_state = RequestDrafts(DraftLength(self.max_draft_tokens, self.row_costs))
        k = min(max_tokens, state.length.next_k())
        if k <= 0:
            return []
        tokens = request.all_token_ids
        continuations = state.own.continuations(tokens)
        if self.suffix_index is not None:
            continuations += self.suffix_index.continuations(tokens, request.cache_salt)
        return choose_draft(continuations, k)

    def observe(self, request, num_drafted: int, num_accepted: int) -> None:
        if request.draft_state is not None:
            request.draft_state.length.observe(num_drafted, num_accepted)

    def record_finished(self, request) -> None:
        """A request ended (stop or length): its prompt + output become drafts for later ones."""
        if self.suffix_index is not None:
            self.suffix_index.add(request.all_token_ids, request.cache_salt)

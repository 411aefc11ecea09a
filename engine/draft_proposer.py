"""Draft tokens without a draft model: prompt lookup and a cross-request suffix index.

Each step, every running request that speculates gets up to k draft tokens: the tokens that
followed earlier occurrences of its last tokens, in its own prompt + output (prompt lookup,
mode "ngram") and also in recent finished requests' prompts and outputs (mode "suffix", a
bounded SuffixIndex; SuffixDecoding's idea). Occurrences that repeat the most of the last
tokens win; among those the draft follows the continuation most of them agree on, token by
token, and stops where they disagree (`choose_draft`).

k adapts per request and match class (`DraftLength`): from the estimated acceptance rate of
drafts whose occurrences repeat as many last tokens (2-3, 4-7, 8) and what a chunk of 1 + k rows
costs on the backend, the k that emits the most tokens per unit of cost, or none (then
COOLDOWN_STEPS proposals of that class without drafts), so text that does not copy (plain chat)
pays for few rejected rows, and long matches draft long while short ones draft little.
"""

from collections import Counter
from dataclasses import dataclass, field

from engine.draft_index import MAX_MATCH, Continuation, SequenceNgrams, SuffixIndex
from engine.sampling_params import DraftingLogitsProcessor
from engine.speculation_config import DEFAULT_MAX_DRAFT_TOKENS, DEFAULT_SUFFIX_INDEX_TOKENS

# 1 + 7 rows: the cpu backend's few-rows limit (StepPolicy.max_verify_rows_per_step); long copies draft long
COOLDOWN_STEPS = 8  # proposals of a match class without drafts once drafting does not pay for it
ACCEPTANCE_WEIGHT = 0.3  # of the newest verify in an estimate
# A draft continues past a token only while at least this share of the candidates agree on it.
MIN_AGREEMENT = 0.5
# Drafts are told apart by how many of the last tokens their occurrences repeat (the match length):
# class 0 repeats 2-3 tokens, class 1 4-7, class 2 the most counted (MAX_MATCH). Longer matches are
# accepted more often (SmolLM2 on bench.speculation_bench's three workloads: ~0.55, ~0.75, ~0.9 of
# their draft tokens), so each class keeps its own estimate, starting from INITIAL_ACCEPTANCE.
MATCH_CLASS_MIN_LENGTHS = (4, MAX_MATCH)  # the shortest match of classes 1 and 2
INITIAL_ACCEPTANCE = (0.6, 0.7, 0.8)  # a request's estimates before its first verify of each class


def match_class(match_len: int) -> int:
    """0, 1 or 2: the confidence class of a draft whose occurrences repeat `match_len` last tokens."""
    return sum(match_len >= length for length in MATCH_CLASS_MIN_LENGTHS)


@dataclass
class DraftLength:
    """A request's adaptive draft length, per match class.

    Drafts are modelled as accepted one after another with probability `acceptance[c]` each (estimated
    per request and match class c, exponentially weighted): k drafts then emit (1 - a^(k+1)) / (1 - a)
    tokens for a step that costs row_costs[k] (the backend's StepPolicy.verify_row_costs). k is the one
    that emits the most per unit of cost, 0 when none beats a plain decode; after a k of 0 the class
    waits COOLDOWN_STEPS of its proposals, then probes with one draft so that its estimate can recover.
    So weak matches that keep failing do not stop long ones from drafting."""

    max_tokens: int
    row_costs: tuple[float, ...] = (1.0,) * 9
    acceptance: list[float] = field(default_factory=lambda: list(INITIAL_ACCEPTANCE))
    num_cooldown_steps: list[int] = field(default_factory=lambda: [0] * len(INITIAL_ACCEPTANCE))
    is_probing: list[bool] = field(default_factory=lambda: [False] * len(INITIAL_ACCEPTANCE))

    def next_k(self, match: int = 0) -> int:
        """k for this step's draft of match class `match` (0 during its cooldown, which this call counts down)."""
        if self.num_cooldown_steps[match] > 0:
            self.num_cooldown_steps[match] -= 1
            self.is_probing[match] = self.num_cooldown_steps[match] == 0
            return 0
        if self.is_probing[match]:
            return 1
        k = best_draft_length(self.acceptance[match], self.row_costs, self.max_tokens)
        if k == 0:
            self.num_cooldown_steps[match] = COOLDOWN_STEPS
        return k

    def observe(self, num_drafted: int, num_accepted: int, match: int = 0) -> None:
        if num_drafted == 0:
            return
        self.is_probing[match] = False
        # accepted tokens are successes; the first rejection (if any) one failure
        observed = num_accepted / (num_accepted + (num_accepted < num_drafted))
        self.acceptance[match] += ACCEPTANCE_WEIGHT * (observed - self.acceptance[match])


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
    """The proposer's state for one request (DraftProposer.states)."""

    length: DraftLength
    own: SequenceNgrams = field(default_factory=SequenceNgrams)
    match: int = 0  # the match class of the last proposal's n-gram draft
    num_forced: int = 0  # the last proposal's leading drafts that a grammar forced


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


def _forced_tokens(grammars: list[DraftingLogitsProcessor], output_token_ids: list[int]) -> list[int]:
    """The tokens every grammar of the request forces next (their common prefix)."""
    if not grammars:
        return []
    forced = grammars[0].forced_tokens(output_token_ids)
    for grammar in grammars[1:]:
        other = grammar.forced_tokens(output_token_ids)
        num_common = next((i for i, (a, b) in enumerate(zip(forced, other)) if a != b), min(len(forced), len(other)))
        forced = forced[:num_common]
    return list(forced)


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
        # request_id -> its state, from its first proposal until it finishes (record_finished) or is aborted (forget)
        self.states: dict[str, RequestDrafts] = {}

    def propose(self, request, max_tokens: int) -> list[int]:
        """Draft ids for `request` (an engine Request): at most max_tokens. Under a grammar
        (a DraftingLogitsProcessor), the tokens it forces come first, then n-gram drafts it admits;
        the n-gram part is as long as the request's DraftLength says."""
        state = self.states.get(request.request_id)
        if state is None:
            state = self.states[request.request_id] = RequestDrafts(DraftLength(self.max_draft_tokens, self.row_costs))
        state.num_forced = 0
        if max_tokens <= 0:
            return []
        grammars = [p for p in request.sampling.params.logits_processors if isinstance(p, DraftingLogitsProcessor)]
        forced = _forced_tokens(grammars, request.output_token_ids)[:max_tokens]
        tokens = request.all_token_ids
        continuations = state.own.continuations(tokens, forced)
        if self.suffix_index is not None:
            continuations += self.suffix_index.continuations(tokens + forced, request.cache_salt)
        draft: list[int] = []
        if continuations and len(forced) < max_tokens:
            state.match = match_class(max(c.match_len for c in continuations))
            k = min(max_tokens - len(forced), state.length.next_k(state.match))
            draft = choose_draft(continuations, k) if k > 0 else []
        if draft and grammars:
            num_admitted = min(g.num_admitted(request.output_token_ids, forced + draft) for g in grammars)
            draft = draft[:max(0, num_admitted - len(forced))]
        state.num_forced = len(forced)
        return forced + draft

    def observe(self, request, num_drafted: int, num_accepted: int) -> None:
        """A verify of the last proposal: `num_accepted` of its `num_drafted` drafts were kept. Forced
        drafts are not n-gram guesses: only the n-gram part after them updates the estimates."""
        state = self.states.get(request.request_id)
        if state is None or num_accepted < state.num_forced:
            return  # the model tokenized the forced text otherwise: the n-gram part was not tried
        state.length.observe(num_drafted - state.num_forced, num_accepted - state.num_forced, state.match)

    def record_finished(self, request) -> None:
        """A request ended (stop or length): its prompt + output become drafts for later ones."""
        self.forget(request)
        if self.suffix_index is not None:
            self.suffix_index.add(request.all_token_ids, request.cache_salt)

    def forget(self, request) -> None:
        """A request left (finished or aborted): drop its state."""
        self.states.pop(request.request_id, None)

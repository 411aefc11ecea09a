"""Draft tokens without a draft model: prompt lookup and a cross-request suffix index.

Each step, every running request that speculates gets up to k draft tokens: the tokens that
followed earlier occurrences of its last tokens, in its own prompt + output (prompt lookup,
mode "ngram") and also in recent finished requests' prompts and outputs (mode "suffix", a
bounded SuffixIndex; SuffixDecoding's idea). Occurrences that repeat the most of the last
tokens win; among those the draft follows the continuation most of them agree on, token by
token, and stops where they disagree (`choose_draft`).

k adapts per request (`DraftLength`): it grows while drafts are accepted whole, falls to
just past what was accepted otherwise, and after MAX_MISSES verifies in a row with nothing
accepted the request drafts nothing for COOLDOWN_STEPS steps, so text that does not copy
(plain chat) pays for few rejected rows.
"""

from collections import Counter
from dataclasses import dataclass, field

from engine.draft_index import Continuation, SequenceNgrams, SuffixIndex

DEFAULT_MAX_DRAFT_TOKENS = 5
DEFAULT_SUFFIX_INDEX_TOKENS = 200_000  # cross-request tokens kept (~2 MB of ids plus the index)
MAX_MISSES = 2  # verifies in a row that accepted nothing before a cooldown
COOLDOWN_STEPS = 8  # steps without drafts after that
# A draft continues past a token only while at least this share of the candidates agree on it.
MIN_AGREEMENT = 0.5


@dataclass
class DraftLength:
    """A request's adaptive draft length."""

    max_tokens: int
    num_tokens: int = 0  # the k of the next proposal; starts at max_tokens (__post_init__)
    num_misses: int = 0  # verifies in a row that accepted nothing
    num_cooldown_steps: int = 0  # steps left without drafts

    def __post_init__(self):
        self.num_tokens = self.max_tokens

    def next_k(self) -> int:
        """k for this step (0 during a cooldown, which this call counts down)."""
        if self.num_cooldown_steps > 0:
            self.num_cooldown_steps -= 1
            return 0
        return self.num_tokens

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            return
        if num_accepted == num_drafted:
            self.num_tokens = min(self.max_tokens, self.num_tokens + 1)
        else:
            self.num_tokens = max(1, num_accepted + 1)
        self.num_misses = self.num_misses + 1 if num_accepted == 0 else 0
        if self.num_misses >= MAX_MISSES:
            self.num_misses = 0
            self.num_cooldown_steps = COOLDOWN_STEPS


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
                 suffix_index_tokens: int = DEFAULT_SUFFIX_INDEX_TOKENS):
        if mode not in ("ngram", "suffix"):
            raise ValueError(f"a draft proposer's mode is 'ngram' or 'suffix', got {mode!r}")
        if max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be >= 1, got {max_draft_tokens}")
        self.mode = mode
        self.max_draft_tokens = max_draft_tokens
        self.suffix_index = SuffixIndex(suffix_index_tokens) if mode == "suffix" else None

    def propose(self, request, max_tokens: int) -> list[int]:
        """Draft ids for `request` (an engine Request): at most max_tokens, fewer per its DraftLength."""
        state = request.draft_state
        if state is None:
            state = request.draft_state = RequestDrafts(DraftLength(self.max_draft_tokens))
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

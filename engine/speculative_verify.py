"""One step's logits -> each request's new tokens, verifying drafts as it goes.

A chunk has 1 + d logit rows: row j scores the token after the request's tokens plus
drafts[:j]. Rows are taken in order, position by position across the batch: row j of a
request is sampled with its ordinary SamplingState (so penalties, logit_bias,
temperature, top-k/p, min-p and logits processors such as grammar masks see exactly the
tokens generated so far, as when tokens are generated one by one), the token is appended,
and the request goes on to row j + 1 only while the token equals draft j and nothing ended
it (stop token, max_tokens).

Why this keeps outputs unchanged. Row j's logits are what a plain decode would see, since
drafts[:j] equal the tokens accepted. Greedy: the kept tokens are the argmaxes, the longest
draft prefix equal to them plus one more. Sampling: drawing x ~ p at a row and keeping draft
d when x == d is speculative sampling with a point-mass proposal at d (accept d with
probability p(d); otherwise x is distributed as p with d removed, renormalized), so every
token has its own conditional distribution. One uniform is drawn per emitted token, in
order, and none for rows past the first mismatch: a seeded request draws the same
uniforms for the same positions as without speculation, and gets the same tokens.
"""

from dataclasses import dataclass, field

import torch

from engine.request import FinishReason, Request
from engine.sampler import Sampler, is_plain_greedy


@dataclass
class AcceptedTokens:
    """What one request got this step."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # with params.logprobs
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_accepted_drafts: int = 0


def sample_and_verify(sampler: Sampler, logits: torch.Tensor, requests: list[Request],
                      drafts: list[tuple[int, ...]], finish_reason_of) -> list[AcceptedTokens]:
    """logits (M, V) float32, 1 + len(drafts[i]) rows per request in order; appends each request's
    new tokens to its output_token_ids. `finish_reason_of(request, token_id)` is asked after
    each append. -> one AcceptedTokens per request."""
    num_rows = [1 + len(d) for d in drafts]
    first_rows = [sum(num_rows[:i]) for i in range(len(requests))]
    results = [AcceptedTokens() for _ in requests]
    active = list(range(len(requests)))
    # Every row its logits' argmax alone: all rows' tokens in one call (what the sampler gives row by row)
    argmaxes = None
    if all(is_plain_greedy(r.sampling.params) and r.sampling.params.logprobs is None for r in requests):
        argmaxes = logits.max(dim=-1).indices.tolist()
    for position in range(max(num_rows)):
        if not active:
            break
        if argmaxes is not None:
            token_ids = [argmaxes[first_rows[i] + position] for i in active]
            sample = None
        else:
            if len(active) == logits.shape[0]:  # every row: no drafts anywhere (a plain decode step)
                rows = logits
            else:
                index = torch.tensor([first_rows[i] + position for i in active], device=logits.device)
                rows = logits.index_select(0, index)
            sample = sampler(rows, [requests[i].sampling for i in active])
            token_ids = sample.token_ids
        still_active = []
        for row, i in enumerate(active):
            request, result, token_id = requests[i], results[i], token_ids[row]
            request.output_token_ids.append(token_id)
            result.token_ids.append(token_id)
            if request.sampling.params.logprobs is not None and sample.logprobs is not None:  # never argmaxes
                result.logprobs.append(sample.logprobs[row])
                result.top_logprobs.append(sample.top_logprobs[row])
            is_draft = position < len(drafts[i]) and token_id == drafts[i][position]
            result.num_accepted_drafts += is_draft
            result.finish_reason = finish_reason_of(request, token_id)
            if is_draft and result.finish_reason is None:
                still_active.append(i)
        active = still_active
    return results

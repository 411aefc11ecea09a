"""Logits of a prompt's last rows (LLMEngine.prompt_tail_logits, for quality benchmarks).

A request with `num_tail_logit_rows = n` gets the logits of prompt positions
len - n .. len - 1 recorded as its prefill runs through the ordinary scheduled path
(prefix match, document stitching, chunked prefill): row p scores prompt token p + 1,
and the last row scores the first generated token. Those positions are always computed
for the request (the prefix match and stitching stop before them), never taken from cache.
"""

import torch

from engine.request import Request


def tail_logit_rows(request: Request, start: int, end: int) -> tuple[int, int]:
    """(offset of the first tail row in the chunk [start, end), number of tail rows in it)."""
    num_prompt_tokens = len(request.prompt_token_ids)
    first = max(start, num_prompt_tokens - request.num_tail_logit_rows)
    last = min(end, num_prompt_tokens)
    if not request.num_tail_logit_rows or first >= last:
        return 0, 0
    return first - start, last - first


def record_tail_logits(request: Request, position: int, logits: torch.Tensor) -> None:
    """logits (R, V) of positions position..position+R-1; a recompute (preemption) overwrites."""
    for row in range(logits.shape[0]):
        request.tail_logits[position + row] = logits[row].float()


def first_tail_position(request: Request) -> int:
    """The first position whose KV the request must compute itself."""
    return len(request.prompt_token_ids) - request.num_tail_logit_rows


def collect_tail_logits(request: Request) -> torch.Tensor:
    """(num_tail_logit_rows, V) float32, in position order."""
    start = first_tail_position(request)
    missing = [p for p in range(start, len(request.prompt_token_ids)) if p not in request.tail_logits]
    if missing:
        raise AssertionError(f"tail logits of {request.request_id}: positions {missing[:4]}... never ran")
    return torch.stack([request.tail_logits[p] for p in range(start, len(request.prompt_token_ids))])

"""Logprobs of a prompt's own tokens (legacy completions' `echo` with `logprobs`).

Row p of a prompt's logits (computed in prefill, raw: before any processor, bias or
penalty, as OpenAI reports them) scores prompt token p + 1. The engine computes those
rows only for requests whose params ask (`SamplingParams.prompt_logprobs`), without the
prefix cache, since cached tokens have no logits.
"""

import torch

from engine.request import Request


def record_prompt_logprobs(request: Request, position: int, logits: torch.Tensor) -> None:
    """logits (R, V): rows of prompt positions position..position+R-1, in order; appends the
    logprobs of prompt tokens position+1..position+R and their top-k alternatives."""
    if position != len(request.prompt_logprobs):
        raise AssertionError(f"prompt logprobs of {request.request_id} out of order: "
                             f"row {position} after {len(request.prompt_logprobs)} entries")
    num_rows = logits.shape[0]
    next_ids = torch.tensor(request.prompt_token_ids[position + 1:position + 1 + num_rows], device=logits.device)
    logprobs = logits.float().log_softmax(dim=-1)  # (R, V)
    request.prompt_logprobs.extend(logprobs.gather(1, next_ids.unsqueeze(1)).squeeze(1).tolist())
    k = request.sampling.params.prompt_logprobs
    if k:
        top_values, top_ids = logprobs.topk(k, dim=-1)  # (R, k) descending
        request.prompt_top_logprobs.extend(list(zip(ids, values))
                                           for ids, values in zip(top_ids.tolist(), top_values.tolist()))
    else:
        request.prompt_top_logprobs.extend([] for _ in range(num_rows))


def prompt_logprobs_output(request: Request) -> tuple[list[float | None], list[list[tuple[int, float]] | None]]:
    """(one logprob per prompt token, None first; top alternatives likewise) for RequestOutput."""
    return [None, *request.prompt_logprobs], [None, *request.prompt_top_logprobs]

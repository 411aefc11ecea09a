"""One step's batch: the flat token ids, where their K/V go, which rows need logits.

The one place a step is turned into model inputs: the engine's runner, the plain
greedy path (engine/generate.py) and the model tests all build their steps here.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from kernels.attention_inputs import AttentionInputs


@dataclass(frozen=True)
class SequenceChunk:
    """New tokens of one sequence: positions [start, start + len(token_ids)) of it."""

    token_ids: list[int]
    start: int
    page_ids: list[int]  # the sequence's pages, in order (enough for every position)
    wants_logits: bool = True  # its last row's logits are needed (ends a prompt, or a decode)
    # Rows whose logits score the next prompt token (prompt logprobs, tail logits); 0 for most:
    # rows [prompt_logit_row_offset, prompt_logit_row_offset + num_prompt_logit_rows) of the chunk.
    num_prompt_logit_rows: int = 0
    prompt_logit_row_offset: int = 0
    # Its last rows are drafts being verified (speculation): with wants_logits, the logits of
    # the last 1 + num_draft_rows rows are needed, not only the last one's.
    num_draft_rows: int = 0
    # Its last rows hold generated tokens (a decode; a verify chunk's token and drafts), the others prompt
    # tokens: the backend may multiply the two kinds differently (AttentionInputs.num_generated)
    num_generated_rows: int = 0


@dataclass(frozen=True)
class StepBatch:
    input_ids: Tensor  # (N,) int64: every chunk's tokens, concatenated
    attn: AttentionInputs
    logit_rows: Tensor  # (M,) int64: the rows whose logits are needed, in chunk order (a verify chunk's all)
    prompt_logit_rows: Tensor  # (P,) int64: the chunks' prompt-logprob rows, in chunk order


def rows_past_prompt(start: int, end: int, prompt_len: int) -> int:
    """How many of positions [start, end) of a sequence come after its prompt of prompt_len tokens."""
    return max(0, end - max(start, prompt_len))


def build_step_batch(chunks: list[SequenceChunk], page_size: int, device: torch.device) -> StepBatch:
    input_ids: list[int] = []
    logit_rows: list[int] = []
    prompt_logit_rows: list[int] = []
    for chunk in chunks:
        first_row = len(input_ids)
        input_ids.extend(chunk.token_ids)
        first_prompt_row = first_row + chunk.prompt_logit_row_offset
        prompt_logit_rows.extend(range(first_prompt_row, first_prompt_row + chunk.num_prompt_logit_rows))
        if chunk.wants_logits:
            logit_rows.extend(range(len(input_ids) - 1 - chunk.num_draft_rows, len(input_ids)))
    attn = AttentionInputs.for_chunks(
        [(chunk.page_ids, chunk.start, chunk.start + len(chunk.token_ids)) for chunk in chunks], page_size, device,
        [chunk.num_generated_rows for chunk in chunks])
    return StepBatch(torch.tensor(input_ids, dtype=torch.int64, device=device), attn,
                     torch.tensor(logit_rows, dtype=torch.int64, device=device),
                     torch.tensor(prompt_logit_rows, dtype=torch.int64, device=device))


class StepLogits(NamedTuple):
    sampled: Tensor | None  # (M, V) float32 of the batch's logit rows, or None when none
    prompt: Tensor | None  # (P, V) float32 of its prompt-logprob rows, or None when none


def run_step(model, kv_caches: list[tuple[Tensor, Tensor]], batch: StepBatch) -> StepLogits:
    """The model over `batch`; logits only for the rows that need them."""
    hidden = model(batch.input_ids, batch.attn.positions, kv_caches, batch.attn)  # (N, d)
    return StepLogits(_logits_of(model, hidden, batch.logit_rows), _logits_of(model, hidden, batch.prompt_logit_rows))


def _logits_of(model, hidden: Tensor, rows: Tensor) -> Tensor | None:
    return model.compute_logits(hidden.index_select(0, rows)) if rows.numel() else None

"""One step's batch: the flat token ids, where their K/V go, which rows need logits.

The one place a step is turned into model inputs: the engine's runner, the plain
greedy path (engine/generate.py) and the model tests all build their steps here.
"""

from dataclasses import dataclass

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


@dataclass(frozen=True)
class StepBatch:
    input_ids: Tensor  # (N,) int64: every chunk's tokens, concatenated
    attn: AttentionInputs
    logit_rows: Tensor  # (M,) int64: the rows whose logits are needed, in chunk order


def build_step_batch(chunks: list[SequenceChunk], page_size: int, device: torch.device) -> StepBatch:
    input_ids: list[int] = []
    logit_rows: list[int] = []
    for chunk in chunks:
        input_ids.extend(chunk.token_ids)
        if chunk.wants_logits:
            logit_rows.append(len(input_ids) - 1)
    attn = AttentionInputs.for_chunks(
        [(chunk.page_ids, chunk.start, chunk.start + len(chunk.token_ids)) for chunk in chunks], page_size, device)
    return StepBatch(torch.tensor(input_ids, dtype=torch.int64, device=device), attn,
                     torch.tensor(logit_rows, dtype=torch.int64, device=device))


def run_step(model, kv_caches: list[tuple[Tensor, Tensor]], batch: StepBatch) -> Tensor | None:
    """The model over `batch` -> logits (M, V) float32 of its logit rows, or None when none."""
    hidden = model(batch.input_ids, batch.attn.positions, kv_caches, batch.attn)  # (N, d)
    if batch.logit_rows.numel() == 0:
        return None
    return model.compute_logits(hidden.index_select(0, batch.logit_rows))

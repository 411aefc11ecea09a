"""Turns a step's chunks into one flat batch, runs the model, returns logits.

Rows of every scheduled chunk are concatenated (N tokens in all); logits are
computed only for the rows that end a chunk completing its request's known
tokens (a finished prefill or a decode), never for mid-prompt rows.
"""

import torch

from cache.kv_pool import KVPool
from engine.scheduler import ScheduledChunk
from engine.step_batch import SequenceChunk, build_step_batch, run_step
from model.llama import LlamaForCausalLM


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_pool: KVPool, device: torch.device):
        self.model = model
        self.kv_pool = kv_pool
        self.page_size = kv_pool.page_size
        self.device = device

    def run(self, chunks: list[ScheduledChunk]) -> tuple[torch.Tensor | None, list[ScheduledChunk]]:
        """Returns (logits (M, V) float32 or None, the M chunks they belong to)."""
        batch = build_step_batch(
            [SequenceChunk(chunk.request.token_ids_between(chunk.start, chunk.start + chunk.num_tokens), chunk.start,
                           chunk.request.page_ids, chunk.completes_request_tokens) for chunk in chunks],
            self.page_size, self.device)
        logits = run_step(self.model, self.kv_pool.layers, batch)
        return logits, [chunk for chunk in chunks if chunk.completes_request_tokens]

"""Turns a step's chunks into one flat batch, runs the model, returns logits.

Rows of every scheduled chunk are concatenated (N tokens in all); logits are
computed only for the rows that end a chunk completing its request's known
tokens (a finished prefill or a decode), never for mid-prompt rows.
"""

import torch

from cache.kv_pool import KVPool
from model.llama import LlamaForCausalLM
from engine.scheduler import ScheduledChunk
from kernels.paged_attention import AttentionInputs


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_pool: KVPool, device: torch.device):
        self.model = model
        self.kv_pool = kv_pool
        self.page_size = kv_pool.page_size
        self.device = device

    def run(self, chunks: list[ScheduledChunk]) -> tuple[torch.Tensor | None, list[ScheduledChunk]]:
        """Returns (logits (M, V) float32 or None, the M chunks they belong to)."""
        page_size = self.page_size
        input_ids: list[int] = []
        slot_ids: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        page_ids_per_seq: list[list[int]] = []
        logit_rows: list[int] = []
        sampled_chunks: list[ScheduledChunk] = []
        for chunk in chunks:
            request = chunk.request
            end = chunk.start + chunk.num_tokens
            page_ids = request.page_ids
            input_ids.extend(request.token_ids_between(chunk.start, end))
            slot_ids.extend(page_ids[p // page_size] * page_size + p % page_size for p in range(chunk.start, end))
            query_lens.append(chunk.num_tokens)
            context_lens.append(end)
            page_ids_per_seq.append(page_ids)
            if chunk.completes_request_tokens:
                logit_rows.append(len(input_ids) - 1)
                sampled_chunks.append(chunk)
        attn = AttentionInputs.build(
            slot_ids=slot_ids,
            query_lens=query_lens,
            context_lens=context_lens,
            page_ids_per_seq=page_ids_per_seq,
            device=self.device,
        )
        hidden = self.model(
            torch.tensor(input_ids, device=self.device),
            attn.positions,
            self.kv_pool.layers,
            attn,
        )  # (N, d)
        if not logit_rows:
            return None, []
        rows = torch.tensor(logit_rows, device=self.device)
        return self.model.compute_logits(hidden.index_select(0, rows)), sampled_chunks

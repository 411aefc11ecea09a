"""Turns a step's chunks into one flat batch, runs the model, returns logits.

Rows of every scheduled chunk are concatenated (N tokens in all); logits are
computed for the rows that end a chunk completing its request's known tokens
(a finished prefill or a decode), and mid-prompt only for a request that asked
for prompt logprobs (each prompt row's logits score the prompt's next token).
"""

import torch

from cache.kv_pool import KVPool
from engine.models.llama import LlamaForCausalLM
from engine.request import Request
from engine.scheduler import ScheduledChunk
from kernels.paged_attention import AttentionInputs

# (request, position p of its first row, logits (R, V) float32 of positions p..p+R-1)
PromptLogits = tuple[Request, int, torch.Tensor]


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_pool: KVPool, device: torch.device):
        self.model = model
        self.kv_pool = kv_pool
        self.page_size = kv_pool.page_size
        self.device = device

    def run(self, chunks: list[ScheduledChunk]
            ) -> tuple[torch.Tensor | None, list[ScheduledChunk], list[PromptLogits]]:
        """Returns (logits (M, V) float32 or None, the M chunks they belong to, the logits of
        prompt rows whose request wants prompt logprobs: a row's logits score the token after it)."""
        page_size = self.page_size
        input_ids: list[int] = []
        slot_ids: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        page_ids_per_seq: list[list[int]] = []
        logit_rows: list[int] = []
        sampled_chunks: list[ScheduledChunk] = []
        prompt_rows: list[int] = []
        prompt_spans: list[tuple[Request, int, int]] = []  # (request, first position, num rows)
        for chunk in chunks:
            request = chunk.request
            end = chunk.start + chunk.num_tokens
            page_ids = request.page_ids
            input_ids.extend(request.token_ids_between(chunk.start, end))
            slot_ids.extend(page_ids[p // page_size] * page_size + p % page_size for p in range(chunk.start, end))
            query_lens.append(chunk.num_tokens)
            context_lens.append(end)
            page_ids_per_seq.append(page_ids)
            if request.needs_prompt_logprobs:
                # rows start..last score prompt tokens start+1..last+1; the prompt's last row samples
                last = min(end, len(request.prompt_token_ids) - 1)
                if last > chunk.start:
                    first_row = len(input_ids) - chunk.num_tokens
                    prompt_rows.extend(range(first_row, first_row + last - chunk.start))
                    prompt_spans.append((request, chunk.start, last - chunk.start))
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
        prompt_logits: list[PromptLogits] = []
        if prompt_rows:
            all_prompt_logits = self.model.compute_logits(
                hidden.index_select(0, torch.tensor(prompt_rows, device=self.device)))
            offset = 0
            for request, position, num_rows in prompt_spans:
                prompt_logits.append((request, position, all_prompt_logits[offset:offset + num_rows]))
                offset += num_rows
        if not logit_rows:
            return None, [], prompt_logits
        rows = torch.tensor(logit_rows, device=self.device)
        return self.model.compute_logits(hidden.index_select(0, rows)), sampled_chunks, prompt_logits

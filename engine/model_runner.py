"""Turns a step's chunks into one flat batch (engine/step_batch.py), runs the model, returns logits.

Rows of every scheduled chunk are concatenated (N tokens in all); logits are
computed for the rows that end a chunk completing its request's known tokens
(a finished prefill or a decode), and mid-prompt only for a request that asked
for prompt logprobs or tail logits (each prompt row's logits score the prompt's next token).
"""

import torch

from cache.kv_pool import KVPool
from engine.prompt_tail_logits import tail_logit_rows
from engine.request import Request
from engine.scheduler import ScheduledChunk
from engine.step_batch import SequenceChunk, build_step_batch, rows_past_prompt, run_step
from model.decoder import DecoderForCausalLM

# (request, position p of its first row, logits (R, V) float32 of positions p..p+R-1)
PromptLogits = tuple[Request, int, torch.Tensor]


class ModelRunner:
    def __init__(self, model: DecoderForCausalLM, kv_pool: KVPool, device: torch.device):
        self.model = model
        self.kv_pool = kv_pool
        self.page_size = kv_pool.page_size
        self.device = device

    def run(self, chunks: list[ScheduledChunk]
            ) -> tuple[torch.Tensor | None, list[ScheduledChunk], list[PromptLogits]]:
        """Returns (logits (M, V) float32 or None, the chunks they belong to (1 + len(drafts)
        rows each, in order), the logits of prompt rows whose request wants prompt logprobs:
        a row's logits score the token after it)."""
        sequence_chunks = []
        prompt_spans: list[tuple[Request, int, int]] = []  # (request, first position, num rows)
        for chunk in chunks:
            request, end = chunk.request, chunk.start + chunk.num_tokens
            num_prompt_rows, row_offset = 0, 0
            if request.needs_prompt_logprobs:
                # rows start..last-1 score prompt tokens start+1..last; the prompt's last row samples
                num_prompt_rows = max(0, min(end, len(request.prompt_token_ids) - 1) - chunk.start)
            elif request.num_tail_logit_rows:
                row_offset, num_prompt_rows = tail_logit_rows(request, chunk.start, end)
            if num_prompt_rows:
                prompt_spans.append((request, chunk.start + row_offset, num_prompt_rows))
            drafts = chunk.draft_token_ids  # a verify chunk: its last token, then the drafts
            token_ids = request.token_ids_between(chunk.start, end - len(drafts)) + list(drafts)
            num_generated = rows_past_prompt(chunk.start, end, len(request.prompt_token_ids))
            sequence_chunks.append(SequenceChunk(token_ids, chunk.start, request.page_ids, chunk.completes_request_tokens,
                                                 num_prompt_rows, row_offset, num_draft_rows=len(drafts),
                                                 num_generated_rows=num_generated))
        logits = run_step(self.model, self.kv_pool.layers, build_step_batch(sequence_chunks, self.page_size, self.device))
        prompt_logits: list[PromptLogits] = []
        offset = 0
        for request, position, num_rows in prompt_spans:
            prompt_logits.append((request, position, logits.prompt[offset:offset + num_rows]))
            offset += num_rows
        return logits.sampled, [chunk for chunk in chunks if chunk.completes_request_tokens], prompt_logits

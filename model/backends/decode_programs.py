"""Decode steps recorded once per batch size and replayed in one C call (the cpu backend's `run_layers`).

A decode step of B sequences (one generated token each) makes the same kernel calls on the same shapes
every time; only the values of a few inputs differ: the embedded tokens, the RoPE rows, the slots their
K/V go to, the page tables and context lengths. So the first such step of each size runs the layers as
usual under a `KernelRecorder` (kernels/kernel_program.py), and later ones write their inputs into the
recorded step's tensors and run the recording from C (why: docs/performance.md, "Decode steps replayed").

Invariants:
- a recording is only kept if nothing but recordable C kernels computed in it (any torch op that computes,
  or another C call, spoils it: then that size keeps the usual path, and `not_replayed` says why);
- the first replay of each recording runs beside the usual path and must equal it bit for bit, or the
  recording is dropped (every kernel computes a row alike whatever shares its call, so they agree);
- the recorded step's page table is as wide as the KV pool has pages, so any later context fits it;
- a recording replays only on the KV caches (the pool's list of layers) it was made on, and holds them;
- only the attention plans' decode batches, the slot ids, the RoPE rows and the input rows are refreshed:
  a step whose plans hold anything else (prompt rows, chunks) is not recorded.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from torch import Tensor

from kernels.attention_inputs import AttentionInputs
from kernels.attention_plan import DecodeBatch
from kernels.kernel_program import KernelProgram, KernelRecorder
from kernels.kv_format import as_pages

# Decode batches of up to this many sequences are recorded. Each recording keeps every tensor its step made
# (0.97 MiB a sequence for the default model, 2.33 MiB for a 1B model: docs/performance.md, "Decode steps
# replayed"), so 1..8 take 36 and 84 MiB at most. Python's share of a step shrinks with the batch, and so
# does what a replay saves.
MAX_REPLAYED_BATCH = 8

logger = logging.getLogger("radixserve.backends")


@dataclasses.dataclass
class _Recording:
    program: KernelProgram
    hidden: Tensor  # (B, d) the recorded step's input rows; the program reads them
    ropes: list[tuple[Tensor, Tensor]]  # its (cos, sin) rows
    slot_ids: Tensor  # (B,) where its K/V went
    decode_batches: list[tuple[tuple, DecodeBatch]]  # (plan key, its decode batch), page tables as wide as the pool
    out: Tensor  # (B, d) where the program leaves the result
    # The KV caches it reads and writes (the pool's list of layers): only steps over this same list replay it,
    # and holding the list keeps the pages its pointers name alive
    kv_caches: list
    checked: bool = False  # replayed once beside the usual path, bit for bit


class DecodePrograms:
    def __init__(self, runner, max_batch: int = MAX_REPLAYED_BATCH):
        self._runner = runner  # run_kernel_program (kernels/kernel_program.py)
        self.max_batch = max_batch
        self._recordings: dict[int, _Recording] = {}  # by the step's number of sequences
        self.not_replayed: dict[int, str] = {}  # number of sequences -> why such a step runs the usual path
        self.replays = 0

    def run(self, layers, hidden: Tensor, ropes: list[tuple[Tensor, Tensor]], kv_caches: list,
            attn: AttentionInputs) -> Tensor:
        num_seqs = attn.num_seqs
        if (num_seqs > self.max_batch or attn.num_tokens != num_seqs or attn.num_generated != (1,) * num_seqs
                or num_seqs in self.not_replayed):  # not a plain decode step, or one that does not record
            return layers(hidden, ropes, kv_caches, attn)
        recording = self._recordings.get(num_seqs)
        if recording is None or recording.kv_caches is not kv_caches:  # (other caches: a new recording replaces it)
            return self._record(layers, hidden, ropes, kv_caches, attn)
        out = self._replay(recording, hidden, ropes, attn)
        if not recording.checked:
            usual = layers(hidden, ropes, kv_caches, attn)
            if not torch.equal(out, usual):
                self._drop(num_seqs, "its first replay differed from the usual path")
                return usual
            recording.checked = True
        self.replays += 1
        return out

    def _record(self, layers, hidden: Tensor, ropes, kv_caches: list, attn: AttentionInputs) -> Tensor:
        wide = attn.widened(as_pages(kv_caches[0][0]).shape[0])
        recorder = KernelRecorder(self._runner)
        with recorder:
            out = layers(hidden, ropes, kv_caches, wide)
        program = recorder.program(keep=(hidden, ropes, wide))
        decode_batches = [(key, _decode_batch_of(wide, key)) for key in wide.plan_keys]
        if program is None:
            self._drop(attn.num_seqs, recorder.spoiled)
        elif any(batch is None for _, batch in decode_batches):
            self._drop(attn.num_seqs, "its attention plans hold more than a decode batch")
        else:
            self._recordings[attn.num_seqs] = _Recording(program, hidden, ropes, wide.slot_ids, decode_batches, out,
                                                         kv_caches)
        return out.clone()

    def _replay(self, recording: _Recording, hidden: Tensor, ropes, attn: AttentionInputs) -> Tensor:
        recording.hidden.copy_(hidden)
        for (cos, sin), (new_cos, new_sin) in zip(recording.ropes, ropes):
            cos.copy_(new_cos)
            sin.copy_(new_sin)
        recording.slot_ids.copy_(attn.slot_ids)
        for key, batch in recording.decode_batches:
            new = attn.plan(*key).decode_batch  # the same kind of plan: a decode batch of as many sequences
            batch.rows.copy_(new.rows)
            batch.context_lens.copy_(new.context_lens)
            batch.page_table[:, :new.page_table.shape[1]].copy_(new.page_table)
        recording.program.run()
        return recording.out.clone()

    def _drop(self, num_seqs: int, reason: str) -> None:
        self._recordings.pop(num_seqs, None)
        self.not_replayed[num_seqs] = reason
        logger.info("decode steps of %d sequences run the usual path: %s", num_seqs, reason)


def _decode_batch_of(attn: AttentionInputs, plan_key: tuple) -> DecodeBatch | None:
    """The plan's decode batch, if that is all the plan holds; else None."""
    plan = attn.plan(*plan_key)
    if plan.decode_chunks or plan.prefills or plan.prefill_batch is not None:
        return None
    return plan.decode_batch

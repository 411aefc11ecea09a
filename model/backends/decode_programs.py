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
- only the attention plans' decode batches, the slot ids, the RoPE rows and the input rows are refreshed:
  a step whose plans hold anything else (prompt rows, chunks) is not recorded.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from torch import Tensor

from kernels.attention_inputs import AttentionInputs
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
    attn: AttentionInputs  # its inputs, page table widened to the pool's pages
    out: Tensor  # (B, d) where the program leaves the result
    caches: tuple[int, ...]  # the KV pages it reads and writes (addresses): only those caches replay it
    checked: bool = False  # replayed once beside the usual path, bit for bit


class DecodePrograms:
    def __init__(self, runner, max_batch: int = MAX_REPLAYED_BATCH):
        self._runner = runner  # run_kernel_program (kernels/kernel_program.py)
        self.max_batch = max_batch
        self._recordings: dict[tuple, _Recording] = {}
        self.not_replayed: dict[tuple, str] = {}  # key -> why that step runs the usual path
        self.replays = 0

    def run(self, layers, hidden: Tensor, ropes: list[tuple[Tensor, Tensor]], kv_caches: list,
            attn: AttentionInputs) -> Tensor:
        key = self._key(hidden, ropes, kv_caches, attn)
        if key is None or key in self.not_replayed:
            return layers(hidden, ropes, kv_caches, attn)
        recording = self._recordings.get(key)
        caches = _addresses(kv_caches)
        if recording is None or recording.caches != caches:  # (other caches: a recording for them replaces it)
            return self._record(key, caches, layers, hidden, ropes, kv_caches, attn)
        out = self._replay(recording, hidden, ropes, attn)
        if not recording.checked:
            usual = layers(hidden, ropes, kv_caches, attn)
            if not torch.equal(out, usual):
                self._drop(key, "its first replay differed from the usual path")
                return usual
            recording.checked = True
        self.replays += 1
        return out

    def _key(self, hidden: Tensor, ropes, kv_caches: list, attn: AttentionInputs) -> tuple | None:
        """Steps alike enough to share a recording, or None for a step that is not a plain decode."""
        num_seqs = attn.num_seqs
        if (not kv_caches or num_seqs > self.max_batch or attn.num_tokens != num_seqs
                or attn.num_generated != (1,) * num_seqs or hidden.dtype != torch.float32):
            return None
        return num_seqs, hidden.shape[1], len(ropes)

    def _record(self, key: tuple, caches: tuple[int, ...], layers, hidden: Tensor, ropes, kv_caches: list, attn: AttentionInputs) -> Tensor:
        wide = attn.widened(as_pages(kv_caches[0][0]).shape[0])
        recorder = KernelRecorder(self._runner)
        with recorder:
            out = layers(hidden, ropes, kv_caches, wide)
        program = recorder.program(keep=(hidden, ropes, wide, out))
        if program is None:
            self._drop(key, recorder.spoiled)
        elif any(_refreshed_parts(wide, plan_key) is None for plan_key in wide.plan_keys):
            self._drop(key, "its attention plans hold more than a decode batch")
        else:
            self._recordings[key] = _Recording(program, hidden, ropes, wide, out, caches)
        return out.clone()

    def _replay(self, recording: _Recording, hidden: Tensor, ropes, attn: AttentionInputs) -> Tensor:
        recording.hidden.copy_(hidden)
        for (cos, sin), (new_cos, new_sin) in zip(recording.ropes, ropes):
            cos.copy_(new_cos)
            sin.copy_(new_sin)
        recorded = recording.attn
        recorded.slot_ids.copy_(attn.slot_ids)
        for plan_key in recorded.plan_keys:
            old, new = _refreshed_parts(recorded, plan_key), _refreshed_parts(attn, plan_key)
            old.rows.copy_(new.rows)
            old.context_lens.copy_(new.context_lens)
            old.page_table[:, :new.page_table.shape[1]].copy_(new.page_table)
        recording.program.run()
        return recording.out.clone()

    def _drop(self, key: tuple, reason: str) -> None:
        self._recordings.pop(key, None)
        self.not_replayed[key] = reason
        logger.info("decode steps of %d sequences run the usual path: %s", key[0], reason)


def _addresses(kv_caches: list) -> tuple[int, ...]:
    """Where every layer's K and V pages (values and scales) and how many pages: a recording's pointers
    hold for these caches only."""
    return (as_pages(kv_caches[0][0]).shape[0], *(plane.data_ptr() for layer in kv_caches for half in layer
                                                   for plane in as_pages(half).planes))


def _refreshed_parts(attn: AttentionInputs, plan_key: tuple):
    """The plan's decode batch, if that is all the plan holds; else None."""
    plan = attn.plan(*plan_key)
    if plan.decode_chunks or plan.prefills or plan.prefill_batch is not None or plan.decode_batch is None:
        return None
    return plan.decode_batch

"""Per-step description of a batch for paged attention (which tokens, which pages, which rows are prompt rows)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import Tensor

from kernels.attention_plan import AttentionPlan, AttentionPolicy, make_plan


def slot_ids_of(page_ids: list[int], start: int, end: int, page_size: int) -> list[int]:
    """The flat KV slot of each position in [start, end) of a sequence whose pages are
    page_ids, in order: page_ids[p // page_size] * page_size + p % page_size."""
    return [page_ids[p // page_size] * page_size + p % page_size for p in range(start, end)]


@dataclass(frozen=True, eq=False)
class AttentionInputs:
    """Where a step's new tokens go in the KV pool and what each sequence attends to.

    Built once per engine step and shared by every layer, so anything derived from it
    (positions, gather indices, masks) is computed once, lazily, and cached on the instance.

    Invariants (checked in __post_init__): 1 <= query_len_b <= context_lens[b] for every
    sequence b; the rows of q are the sequences' new tokens, in sequence order; a sequence's
    new tokens are the last query_len_b of its context_lens[b] positions.
    """

    slot_ids: Tensor  # (N,) int64: flat KV slot of each new token = page_id * page_size + offset
    query_starts: list[int]  # (B+1,) cumulative: sequence b's new tokens are rows [qs[b], qs[b+1])
    context_lens: list[int]  # (B,) tokens in sequence b's KV after this step, new tokens included
    page_table: Tensor  # (B, max_pages) int64, pages in order; padding: any valid page id
    # (B,) how many of sequence b's new tokens, its last, are generated tokens (a decode; a verify chunk's token
    # and drafts), the rest prompt tokens; () unknown. A backend may multiply the two kinds differently.
    num_generated: tuple[int, ...] = ()
    _plans: dict[tuple[int, AttentionPolicy, int | None], AttentionPlan] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        num_seqs = len(self.context_lens)
        if len(self.query_starts) != num_seqs + 1 or self.query_starts[0] != 0:
            raise ValueError("query_starts must be cumulative, start at 0 and have B+1 entries")
        if self.page_table.dim() != 2 or self.page_table.shape[0] != num_seqs:
            raise ValueError(f"page_table must be (B={num_seqs}, max_pages), got {tuple(self.page_table.shape)}")
        if self.num_generated and len(self.num_generated) != num_seqs:
            raise ValueError(f"num_generated must have B={num_seqs} entries, got {len(self.num_generated)}")
        if self.slot_ids.shape != (self.query_starts[-1],):
            raise ValueError(f"slot_ids must be (N={self.query_starts[-1]},), got {tuple(self.slot_ids.shape)}")
        for b, (query_len, context_len) in enumerate(zip(self.query_lens, self.context_lens)):
            if not 1 <= query_len <= context_len:
                raise ValueError(f"sequence {b}: need 1 <= query_len ({query_len}) <= context_len ({context_len})")
            if self.num_generated and not 0 <= self.num_generated[b] <= query_len:
                raise ValueError(f"sequence {b}: need 0 <= num_generated ({self.num_generated[b]}) <= query_len "
                                 f"({query_len})")

    @classmethod
    def build(
        cls,
        slot_ids: list[int],
        query_lens: list[int],
        context_lens: list[int],
        page_ids_per_seq: list[list[int]],
        device,
        num_generated: list[int] | None = None,
    ) -> AttentionInputs:
        """From plain lists: pads the page table with page 0 and puts tensors on `device`."""
        query_starts = [0]
        for query_len in query_lens:
            query_starts.append(query_starts[-1] + query_len)
        max_pages = max((len(pages) for pages in page_ids_per_seq), default=0) or 1
        padded = [pages + [0] * (max_pages - len(pages)) for pages in page_ids_per_seq]
        return cls(
            slot_ids=torch.tensor(slot_ids, dtype=torch.int64, device=device),
            query_starts=query_starts,
            context_lens=list(context_lens),
            page_table=torch.tensor(padded, dtype=torch.int64, device=device).view(len(padded), max_pages),
            num_generated=tuple(num_generated or ()),
        )

    @classmethod
    def for_chunks(cls, chunks: list[tuple[list[int], int, int]], page_size: int, device,
                   num_generated: list[int] | None = None) -> AttentionInputs:
        """One step of sequences given as (page_ids, start, end): each adds the tokens of
        positions [start, end) to its pages, attending to positions [0, end)."""
        slot_ids: list[int] = []
        for page_ids, start, end in chunks:
            slot_ids.extend(slot_ids_of(page_ids, start, end, page_size))
        return cls.build(slot_ids, [end - start for _, start, end in chunks], [end for _, _, end in chunks],
                         [page_ids for page_ids, _, _ in chunks], device, num_generated)

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def num_tokens(self) -> int:
        return self.query_starts[-1]

    @functools.cached_property
    def query_lens(self) -> list[int]:
        starts = self.query_starts
        return [starts[b + 1] - starts[b] for b in range(len(starts) - 1)]

    @functools.cached_property
    def generated_rows(self) -> Tensor:
        """(G,) int64: the rows of generated tokens (num_generated; empty when unknown)."""
        rows = [row for b, count in enumerate(self.num_generated)
                for row in range(self.query_starts[b + 1] - count, self.query_starts[b + 1])]
        return torch.tensor(rows, dtype=torch.int64, device=self.slot_ids.device)

    @functools.cached_property
    def prompt_rows(self) -> Tensor:
        """(P,) int64: the rows of prompt tokens (every row when num_generated is unknown)."""
        counts = self.num_generated or (0,) * self.num_seqs
        rows = [row for b, count in enumerate(counts)
                for row in range(self.query_starts[b], self.query_starts[b + 1] - count)]
        return torch.tensor(rows, dtype=torch.int64, device=self.slot_ids.device)

    @functools.cached_property
    def max_context_len(self) -> int:
        return max(self.context_lens, default=0)

    @functools.cached_property
    def positions(self) -> Tensor:
        """(N,) int64 position of each new token in its sequence (what RoPE needs)."""
        positions = [
            pos
            for query_len, context_len in zip(self.query_lens, self.context_lens)
            for pos in range(context_len - query_len, context_len)
        ]
        return torch.tensor(positions, dtype=torch.int64, device=self.slot_ids.device)

    def widened(self, max_pages: int) -> AttentionInputs:
        """The same step with its page table padded with page 0 to `max_pages` columns (>= its own)."""
        width = self.page_table.shape[1]
        if max_pages < width:
            raise ValueError(f"cannot narrow a page table of {width} columns to {max_pages}")
        table = torch.zeros((self.num_seqs, max_pages), dtype=torch.int64, device=self.page_table.device)
        table[:, :width] = self.page_table
        return AttentionInputs(self.slot_ids.clone(), list(self.query_starts), list(self.context_lens), table,
                               self.num_generated)

    @property
    def plan_keys(self) -> list[tuple[int, AttentionPolicy, int | None]]:
        """The (page_size, policy, window) of every plan built so far."""
        return list(self._plans)

    def plan(self, page_size: int, policy: AttentionPolicy, window: int | None = None) -> AttentionPlan:
        """Gather indices and masks for this step, built on the first call of each kind of layer
        (`window`: a sliding-window layer's, else None)."""
        key = (page_size, policy, window)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = make_plan(self, page_size, policy, window)
        return plan

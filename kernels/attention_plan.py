"""Per-step gather indices and masks for paged attention, built once and shared by all layers.

How the work is cut is an `AttentionPolicy`, which the execution backend chooses once
(model/backends): decode sequences (one new token) go either all at once to a fused
kernel that reads pages itself, or in chunks: sorted by context length, packed into
chunks of at most `decode_token_budget` padded KV positions, each chunk one gather + one
SDPA call. Prefills (more than one new token) run one sequence at a time; with a cached
prefix the causal mask is bottom-right aligned, and SDPA cannot skip masked blocks of an
explicit mask, so the query rows go in blocks of `prefill_block_rows`, each attending only
to the keys it can see. A sliding-window layer (Gemma 2/3, Mistral, Phi-3) gets its own plan:
the same cuts, its masks also hiding keys `window` or more positions behind the query (the
full KV is kept; only the mask knows the window). The measurements behind the CPU values:
docs/performance.md.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from kernels.attention_inputs import AttentionInputs

# On CPU one big gather falls out of cache and padding adds work, while per-sequence calls pay
# Python overhead each: chunks of this many padded positions measured fastest (docs/performance.md).
CPU_DECODE_TOKEN_BUDGET = 2048
# Row blocks of a prefill after a cached prefix, so masked keys are skipped (measured 1.8x).
CPU_PREFILL_BLOCK_ROWS = 256


@dataclass(frozen=True)
class AttentionPolicy:
    """How a step's attention is cut into calls; chosen once by the execution backend."""

    decode_token_budget: int  # padded KV positions per decode chunk (sys.maxsize: the whole batch)
    prefill_block_rows: int  # query rows per SDPA call when a prefill has a cached prefix
    fused_decode: bool = False  # every decode sequence to one kernel that reads the pages itself
    # With fused_decode: a sequence of at most this many new tokens after a cached prefix (a speculative
    # verify chunk: the last token and its drafts) goes to the decode kernel as that many decode rows,
    # row i seeing the context up to itself; one kernel call instead of a gather + SDPA per layer.
    max_rows_as_decode: int = 1
    # Every prefill sequence (more new tokens than a decode) to one kernel that reads the pages itself.
    fused_prefill: bool = False
    # A sequence of prompt tokens only (AttentionInputs.num_generated 0) goes to the prefill path however few its new
    # tokens, so a prompt row's attention is computed alike whatever its chunk (the prefill kernel's rows do
    # not depend on how a prompt is chunked); decode and verify chunks as above.
    prompts_as_prefill: bool = False

    def __post_init__(self):
        if self.decode_token_budget < 1 or self.prefill_block_rows < 1 or self.max_rows_as_decode < 1:
            raise ValueError(f"attention policy needs positive sizes, got {self}")


# Accelerators: launch overhead dominates, so the whole decode batch is one chunk, a prefill one call.
ONE_CALL_ATTENTION = AttentionPolicy(decode_token_budget=sys.maxsize, prefill_block_rows=sys.maxsize)
CPU_ATTENTION = AttentionPolicy(CPU_DECODE_TOKEN_BUDGET, CPU_PREFILL_BLOCK_ROWS)


@dataclass(frozen=True)
class DecodeChunk:
    """Decode sequences attended together, their KV padded to the longest of them."""

    rows: Tensor  # (b,) int64: the sequences' rows in q and in the output
    slot_ids: Tensor  # (b * L,) int64, sequence-major; a sequence's padding repeats its last slot
    mask: Tensor | None  # (b, 1, 1, L) bool, True at visible positions; None if every position is
    num_seqs: int  # b
    max_len: int  # L


@dataclass(frozen=True)
class DecodeBatch:
    """Every decode sequence of the step, for a kernel that reads pages itself
    (kernels/cpu_decode_ops.py): no gather, no padding."""

    rows: Tensor  # (b,) int64: the sequences' rows in q and in the output
    page_table: Tensor  # (b, max_pages) int64, contiguous
    context_lens: Tensor  # (b,) int64


@dataclass(frozen=True)
class PrefillBatch:
    """Every prefill sequence of the step, for a kernel that reads pages itself
    (kernels/cpu_prefill_attention.py): no gather, no mask (it applies causality and the window)."""

    q_starts: Tensor  # (b,) int64: a sequence's first row in q and in the output
    query_lens: Tensor  # (b,) int64: its rows, at positions context_len - query_len onwards
    context_lens: Tensor  # (b,) int64
    page_table: Tensor  # (b, max_pages) int64, contiguous


@dataclass(frozen=True)
class PrefillSeq:
    """One sequence with several new tokens: rows [start, end) of q, context C."""

    start: int
    end: int
    slot_ids: Tensor  # (C,) int64, the slots of positions 0..C-1
    # (T, C) bool, row i sees keys <= C - T + i (and, with a window W, > C - T + i - W); None when
    # plain causal (C == T, no window cuts)
    mask: Tensor | None


@dataclass(frozen=True)
class AttentionPlan:
    decode_chunks: list[DecodeChunk]  # empty when decode_batch is set
    decode_batch: DecodeBatch | None  # with fused decode: all decode sequences, else None
    prefills: list[PrefillSeq]  # empty when prefill_batch is set
    prefill_batch: PrefillBatch | None  # with fused prefill: all prefill sequences, else None
    prefill_block_rows: int  # query rows per SDPA call when a prefill has a cached prefix


def make_plan(inputs: AttentionInputs, page_size: int, policy: AttentionPolicy,
              window: int | None = None) -> AttentionPlan:
    """`window`: a sliding-window layer's W (a query at position p sees keys in (p - W, p]), or None.
    A fused decode or prefill batch carries no mask: its kernel applies the window itself."""
    max_decode_rows = policy.max_rows_as_decode if policy.fused_decode else 1
    generated = inputs.num_generated if policy.prompts_as_prefill else ()
    is_decode = [(query_len == 1 or (query_len <= max_decode_rows and inputs.context_lens[b] > query_len))
                 and not (generated and generated[b] == 0) for b, query_len in enumerate(inputs.query_lens)]
    decode_seqs = [b for b, decode in enumerate(is_decode) if decode]
    decode_chunks, decode_batch = [], None
    if policy.fused_decode and decode_seqs:
        decode_batch = _decode_batch(inputs, decode_seqs)
    elif decode_seqs:
        decode_chunks = [
            _decode_chunk(inputs, group, page_size, window)
            for group in _pack_by_length(decode_seqs, inputs.context_lens, policy.decode_token_budget)
        ]
    prefill_seqs = [b for b, decode in enumerate(is_decode) if not decode]
    prefills, prefill_batch = [], None
    if policy.fused_prefill and prefill_seqs:
        prefill_batch = _prefill_batch(inputs, prefill_seqs)
    else:
        prefills = [_prefill_seq(inputs, b, page_size, window) for b in prefill_seqs]
    return AttentionPlan(decode_chunks, decode_batch, prefills, prefill_batch, policy.prefill_block_rows)


def _prefill_batch(inputs: AttentionInputs, seqs: list[int]) -> PrefillBatch:
    device = inputs.page_table.device
    page_table = inputs.page_table
    if seqs != list(range(inputs.num_seqs)):
        page_table = page_table.index_select(0, torch.tensor(seqs, dtype=torch.int64, device=device))
    return PrefillBatch(
        q_starts=torch.tensor([inputs.query_starts[b] for b in seqs], dtype=torch.int64, device=device),
        query_lens=torch.tensor([inputs.query_lens[b] for b in seqs], dtype=torch.int64, device=device),
        context_lens=torch.tensor([inputs.context_lens[b] for b in seqs], dtype=torch.int64, device=device),
        page_table=page_table.contiguous(),
    )


def _decode_batch(inputs: AttentionInputs, seqs: list[int]) -> DecodeBatch:
    """One decode row per new token of `seqs`: row i of a T-token sequence of context C sees C - T + 1 + i."""
    device = inputs.page_table.device
    rows, context_lens, row_seqs = [], [], []
    for b in seqs:
        query_len, context_len, start = inputs.query_lens[b], inputs.context_lens[b], inputs.query_starts[b]
        rows.extend(range(start, start + query_len))
        context_lens.extend(range(context_len - query_len + 1, context_len + 1))
        row_seqs.extend([b] * query_len)
    page_table = inputs.page_table
    if row_seqs != list(range(inputs.num_seqs)):
        page_table = page_table.index_select(0, torch.tensor(row_seqs, dtype=torch.int64, device=device))
    return DecodeBatch(
        rows=torch.tensor(rows, dtype=torch.int64, device=device),
        page_table=page_table.contiguous(),
        context_lens=torch.tensor(context_lens, dtype=torch.int64, device=device),
    )


def _pack_by_length(seqs: list[int], context_lens: list[int], budget: int) -> list[list[int]]:
    """Groups of similar length whose padded size (count * longest) stays within budget;
    a sequence longer than the budget gets a group of its own."""
    groups: list[list[int]] = []
    current: list[int] = []
    for b in sorted(seqs, key=lambda b: context_lens[b]):
        if current and (len(current) + 1) * context_lens[b] > budget:
            groups.append(current)
            current = []
        current.append(b)
    if current:
        groups.append(current)
    return groups


def _slots(page_rows: Tensor, positions: Tensor, page_size: int) -> Tensor:
    """page_rows (b, max_pages), positions (b, L) -> (b, L) flat slot of each position."""
    page_ids = page_rows.gather(1, positions // page_size)
    return page_ids * page_size + positions % page_size


def _decode_chunk(inputs: AttentionInputs, group: list[int], page_size: int, window: int | None) -> DecodeChunk:
    device = inputs.page_table.device
    seq_lens = [inputs.context_lens[b] for b in group]
    max_len = max(seq_lens)
    lens = torch.tensor(seq_lens, dtype=torch.int64, device=device)  # (b,)
    positions = torch.arange(max_len, dtype=torch.int64, device=device)  # (L,)
    # Padding reads a real slot of the same sequence (finite), never an unwritten one: a
    # masked score gets weight 0, but 0 * NaN from garbage V would still poison the output.
    clamped = torch.minimum(positions[None, :], lens[:, None] - 1)  # (b, L)
    seq_ids = torch.tensor(group, dtype=torch.int64, device=device)
    slot_ids = _slots(inputs.page_table.index_select(0, seq_ids), clamped, page_size)
    is_padded = min(seq_lens) < max_len
    is_windowed = window is not None and max_len > window
    mask = None
    if is_padded or is_windowed:
        visible = positions[None, :] < lens[:, None]  # (b, L)
        if is_windowed:  # the query sits at position len - 1
            visible &= positions[None, :] > lens[:, None] - 1 - window
        mask = visible[:, None, None, :]
    rows = torch.tensor([inputs.query_starts[b] for b in group], dtype=torch.int64, device=device)
    return DecodeChunk(rows, slot_ids.reshape(-1), mask, len(group), max_len)


def _prefill_seq(inputs: AttentionInputs, b: int, page_size: int, window: int | None) -> PrefillSeq:
    device = inputs.page_table.device
    start, end = inputs.query_starts[b], inputs.query_starts[b + 1]
    context_len = inputs.context_lens[b]
    positions = torch.arange(context_len, dtype=torch.int64, device=device)  # (C,)
    slot_ids = _slots(inputs.page_table[b : b + 1], positions[None, :], page_size)[0]
    query_len = end - start
    mask = None
    if context_len > query_len or (window is not None and context_len > window):
        mask = torch.ones(query_len, context_len, dtype=torch.bool, device=device)
        mask = mask.tril(context_len - query_len)  # (T, C) bottom-right causal
        if window is not None:
            mask = mask.triu(context_len - query_len - window + 1)  # keys within W of the query
    return PrefillSeq(start, end, slot_ids, mask)

"""CacheBlend-style selective recompute (EuroSys'25) of placed document KV, behind
DocumentReuseConfig.recompute_fraction = r > 0 (`serve --document-recompute-fraction`).

Placed KV (engine/document_kv_copy.py) was computed with its span alone; in the new context a few
of its tokens would have very different KV. For each request whose spans were placed this step,
before its first forward:
1. Probe. Gather layer L's placed K/V at the placed positions, then run the model's first L + 1
   layers (DecoderForCausalLM.forward's num_layers limit) over every position from the request's
   num_computed_tokens to the end of its last placed run, as one chunk: each row attends causally to
   all rows before it, so layers 0..L of those positions are what full prefill in this context gives,
   and they stay in the pages. Layer 0's K/V depends only on token and position (re-rotated K equals
   exact K there), so deviation first shows at layer 1: L = DEVIATION_LAYER.
2. Select. A placed token's deviation is the L2 norm over heads and dims of its layer-L K and V
   difference, fresh minus placed; the round(r * placed) most deviating tokens are chosen.
3. Recompute. The chosen tokens leave the request's stitched runs (Request.stitched_runs, split
   around them), so its compute ranges (Request.next_compute_ranges) gain them, adjacent ones merged
   into runs: they run through every layer as chunks attending causally to the stitched KV and to each
   other's fresh KV. The step's chunks of that request are cut again from the new ranges within the
   same number of tokens, so they end no later than before and its pages already cover them.

Tokens not chosen keep the probe's fresh layers 0..L and their placed deeper layers. The KV stays
derived (num_exact_tokens is untouched: recomputed tokens inside a placed run do not make it exact).
The probe's positions are not counted as computed tokens (they ran (L + 1) / num_layers of the model);
the chosen ones are (DocumentReuse.count_selective_recompute). With r = 1 every placed token is
recomputed and the request computes what full prefill computes.
"""

import torch
from torch import Tensor

from cache.kv_pool import KVPool
from engine.request import Request
from engine.scheduler import ScheduledChunk
from engine.step_batch import SequenceChunk, build_step_batch
from kernels.attention_inputs import slot_ids_of

DEVIATION_LAYER = 1  # L: the first layer whose placed K/V can differ from exact


def most_deviating(k_placed: Tensor, v_placed: Tensor, k_fresh: Tensor, v_fresh: Tensor, num_chosen: int) -> Tensor:
    """Indices (num_chosen,) int64, ascending, of the rows whose K/V deviate most: k_*, v_* (T, KVH, D);
    a row's deviation is sqrt(sum over heads and dims of (k_fresh - k_placed)^2 + (v_fresh - v_placed)^2)."""
    k_delta = (k_fresh.float() - k_placed.float()).flatten(1)
    v_delta = (v_fresh.float() - v_placed.float()).flatten(1)
    deviation = torch.cat([k_delta, v_delta], dim=1).norm(dim=1)  # (T,)
    return deviation.topk(num_chosen).indices.sort().values


def split_runs(runs: list[tuple[int, int]], chosen: list[int]) -> list[tuple[int, int]]:
    """The sorted runs [start, end) without the sorted positions `chosen` (each inside some run)."""
    remaining: list[tuple[int, int]] = []
    positions = iter(chosen)
    position = next(positions, None)
    for start, end in runs:
        while position is not None and position < end:
            if position > start:
                remaining.append((start, position))
            start = position + 1
            position = next(positions, None)
        if start < end:
            remaining.append((start, end))
    return remaining


class SelectiveRecompute:
    """Probes the requests whose spans were just placed, chooses their tokens to recompute and cuts
    their chunks of the step again. One per engine; DocumentReuse (engine/document_reuse.py) runs it and counts."""

    def __init__(self, fraction: float, model, kv_pool: KVPool, device: torch.device):
        self.fraction = fraction
        self.model = model
        self.kv_pool = kv_pool
        self.device = device
        self.layer = min(DEVIATION_LAYER, len(kv_pool.layers) - 1)
        self.num_probe_tokens = 0  # positions run through the first layer + 1 layers

    def recompute(self, chunks: list[ScheduledChunk],
                  placed: list[Request]) -> tuple[list[ScheduledChunk], list[tuple[Request, int]]]:
        """`placed`: the step's requests whose stored spans were placed into their pages just now
        (before any forward over them). Returns the step's chunks, those requests' cut again, and
        (request, placed tokens chosen for recompute) of each request probed."""
        probed = [request for request in placed if round(self.fraction * _num_placed(request)) > 0]
        if not probed:
            return chunks, []
        chosen = []
        placed_slots = [self._slots(request) for request in probed]
        k_cache, v_cache = self.kv_pool.layers[self.layer]
        dtype = self.kv_pool.shape.dtype  # compared dequantized, in the model's dtype
        before = [(k_cache.gather(slots, dtype), v_cache.gather(slots, dtype)) for slots in placed_slots]
        self._probe(probed)
        for request, slots, (k_placed, v_placed) in zip(probed, placed_slots, before):
            positions = _positions(request.stitched_runs)
            num_chosen = round(self.fraction * len(positions))
            rows = most_deviating(k_placed, v_placed, k_cache.gather(slots, dtype), v_cache.gather(slots, dtype),
                                  num_chosen)
            request.stitched_runs = split_runs(request.stitched_runs, [positions[row] for row in rows.tolist()])
            chosen.append((request, num_chosen))
        return _recut(chunks, {id(request) for request in probed}), chosen

    def _probe(self, requests: list[Request]) -> None:
        """The first layer + 1 layers over [num_computed_tokens, end of the last placed run) of each
        request, in one forward (no logits)."""
        sequences = []
        for request in requests:
            start, end = request.num_computed_tokens, request.stitched_runs[-1][1]
            sequences.append(SequenceChunk(request.token_ids_between(start, end), start, request.page_ids,
                                           wants_logits=False))
            self.num_probe_tokens += end - start
        batch = build_step_batch(sequences, self.kv_pool.page_size, self.device)
        self.model(batch.input_ids, batch.attn.positions, self.kv_pool.layers, batch.attn, num_layers=self.layer + 1)

    def _slots(self, request: Request) -> Tensor:
        """(placed,) int64: the KV slots of the request's placed positions, in order."""
        page_size = self.kv_pool.page_size
        slots = [slot for start, end in request.stitched_runs
                 for slot in slot_ids_of(request.page_ids, start, end, page_size)]
        return torch.tensor(slots, dtype=torch.int64, device=self.device)


def _num_placed(request: Request) -> int:
    return sum(end - start for start, end in request.stitched_runs)


def _positions(runs: list[tuple[int, int]]) -> list[int]:
    return [position for start, end in runs for position in range(start, end)]


def _recut(chunks: list[ScheduledChunk], request_ids: set[int]) -> list[ScheduledChunk]:
    """The chunks of each request in `request_ids` replaced, where its first one was, by chunks over
    its new compute ranges within the same number of tokens."""
    budgets: dict[int, int] = {}
    for chunk in chunks:
        if id(chunk.request) in request_ids:
            budgets[id(chunk.request)] = budgets.get(id(chunk.request), 0) + chunk.num_tokens
    cut: list[ScheduledChunk] = []
    for chunk in chunks:
        key = id(chunk.request)
        if key not in request_ids:
            cut.append(chunk)
        elif key in budgets:
            cut.extend(ScheduledChunk(chunk.request, start, num_tokens)
                       for start, num_tokens in chunk.request.next_compute_ranges(budgets.pop(key)))
    return cut

"""The tensor side of document KV reuse: placing stored spans into a request's pages (K re-rotated
by the position delta, V as is) before the forward that first needs them, and copying spans that
missed the store out of a request's pages as soon as they are computed.

A store entry's KV is a (K, V) pair of StoredRows (kernels/kv_format.py): (num_layers, L + T, KVH, D)
values in the pool's K and V formats (int8 with their (num_layers, L + T, KVH) scales), as the model
wrote them at positions entry.position - L .. entry.position + T - 1 (K already rotated),
L = len(entry.lead_ids) rows of the tokens before the span first.

Placing quantized K: dequantize, rotate, quantize again on the store (the backend's
store_rerotated_kv); V is dequantized and quantized again, which gives back the same int8 values.
"""

import torch

from cache.document_store import DocumentKVStore, document_key
from cache.kv_pool import KVPool
from engine.document_reuse import DocumentPlan
from engine.request import Request
from engine.scheduler import ScheduledChunk
from kernels.attention_inputs import slot_ids_of
from kernels.kv_format import StoredRows
from kernels.rotary import rerotation_cos_sin


class DocumentKVCopier:
    def __init__(self, store: DocumentKVStore, kv_pool: KVPool, backend, layer_inv_freqs: list[torch.Tensor],
                 device: torch.device):
        self.store = store
        self.kv_pool = kv_pool
        self.backend = backend
        # per layer (R/2,) float32: its RoPE frequencies (scaling included; Gemma 3's local and global
        # layers differ, so each layer's K is re-rotated by its own)
        self.layer_inv_freqs = layer_inv_freqs
        self.device = device
        self.num_stored_spans = 0

    def place(self, chunks: list[ScheduledChunk]) -> list[Request]:
        """Copy every pending span of the step's requests into their pages (once each), then give
        the store references back. Returns the requests whose spans were placed."""
        placed = []
        for request in _distinct_requests(chunks):
            plan = request.document_plan
            if not isinstance(plan, DocumentPlan) or not plan.copies:
                continue
            placed.append(request)
            while plan.copies:  # one at a time: a fault leaves only unplaced copies to release
                self._place(request, plan.copies[0])
                self.store.release(plan.copies.pop(0).entry)
        return placed

    def _place(self, request: Request, copy) -> None:
        k_stored, v_stored = copy.entry.kv
        rows = slice(copy.source_start, copy.source_start + copy.num_tokens)
        slots = self._slots(request, copy.start, copy.start + copy.num_tokens)
        tables = {}  # one (cos, sin) per distinct RoPE
        dtype = self.kv_pool.shape.dtype  # the model's: what K is rotated in
        for layer, (k_cache, v_cache) in enumerate(self.kv_pool.layers):
            inv_freq = self.layer_inv_freqs[layer]
            if id(inv_freq) not in tables:
                tables[id(inv_freq)] = rerotation_cos_sin(inv_freq, copy.delta, dtype)
            cos, sin = tables[id(inv_freq)]
            self.backend.store_rerotated_kv(k_stored[layer, rows].dequantized(dtype),
                                            v_stored[layer, rows].dequantized(dtype), cos, sin, k_cache, v_cache,
                                            slots)

    def fill(self, chunks: list[ScheduledChunk]) -> None:
        """For the step's prefilling requests: copy each span that missed the store from their pages
        into it (position and predecessor recorded) as soon as the span is computed, so that requests
        admitted after this step find it (and those waiting for it, DocumentReuse.waits_for_spans, go)."""
        for request in _distinct_requests(chunks):
            plan = request.document_plan
            if not isinstance(plan, DocumentPlan) or not plan.to_store or request.is_finished:
                continue
            computed = [span for span in plan.to_store if span.end <= request.num_computed_tokens]
            for span in computed:
                key = document_key(request.prompt_token_ids[span.start:span.end], request.cache_salt)
                if key in self.store:
                    continue
                lead_start = span.start - span.num_lead_tokens
                k, v = self._gather(request, lead_start, span.end)  # the lead's rows first
                num_bytes = k.num_bytes + v.num_bytes
                if self.store.insert(key, (k, v), num_bytes, span.start, span.predecessor,
                                     request.prompt_token_ids[lead_start:span.start]) is not None:
                    self.num_stored_spans += 1
            if computed:
                plan.to_store = [span for span in plan.to_store if span.end > request.num_computed_tokens]

    def _gather(self, request: Request, start: int, end: int) -> tuple[StoredRows, StoredRows]:
        """(K, V) (num_layers, T, KVH, D) of positions [start, end), copied out of the pool as stored."""
        slots = self._slots(request, start, end)
        return tuple(_stack([layer[half].take_rows(slots) for layer in self.kv_pool.layers]) for half in (0, 1))

    def _slots(self, request: Request, start: int, end: int) -> torch.Tensor:
        page_size = self.kv_pool.page_size
        return torch.tensor(slot_ids_of(request.page_ids, start, end, page_size), dtype=torch.int64,
                            device=self.device)


def _distinct_requests(chunks: list[ScheduledChunk]) -> list[Request]:
    seen: dict[int, Request] = {}
    for chunk in chunks:
        seen.setdefault(id(chunk.request), chunk.request)
    return list(seen.values())


def _stack(layers: list[StoredRows]) -> StoredRows:
    """Per-layer rows (T, KVH, D) -> (num_layers, T, KVH, D)."""
    first = layers[0]
    scales = None if first.scales is None else torch.stack([rows.scales for rows in layers])
    return StoredRows(first.kv_dtype, torch.stack([rows.values for rows in layers]), scales)

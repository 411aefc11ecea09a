"""The engine handle: what the server may use of an engine, written down once.

Two handles implement it: `engine.async_engine.AsyncEngine` (one engine on its own thread in this
process) and `replicas.replica_engine.ReplicaEngine` (N engines behind Ray Serve). The server is
typed against `EngineHandle` and never asks a handle what it has (`hasattr`): what differs between
handles is a declared fact (`precompute_unavailable`, `cached_prefixes_unavailable`, `prometheus_collectors`).
tests/engine/test_engine_handle.py checks that both conform, signatures included, without Ray.

Threads: every method is called from the server's event loop; `stats()` and `facts` never block;
`shutdown()` blocks (the server calls it off the loop).
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from engine.cached_prefixes import CachedPrefix
from engine.metrics import EngineMetrics, EngineStats
from engine.request import RequestOutput
from engine.request_options import DEFAULT_REQUEST_OPTIONS, RequestOptions
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class EngineFacts:
    """What the server needs to know about the loaded model and engine, fixed at load."""

    vocab_size: int
    eos_token_ids: frozenset[int]
    max_model_len: int  # the context length requests get
    max_num_request_tokens: int  # prompt + output of one request at most: the context, and the whole KV pool
    backend: str  # the execution backend's name ("cpu", "torch")
    backend_description: str  # Backend.describe(): what runs, and why each fallback happened
    page_size: int  # tokens a KV page holds: chained page hashes (routing, tiers) are per page


@runtime_checkable
class EngineHandle(Protocol):
    facts: EngineFacts
    # Latency series (TTFT, ITL, e2e, ...): the server's histograms register in `metrics.listeners`.
    metrics: EngineMetrics
    # Why `precompute_documents` cannot run on this handle (a sentence for the API's error), or None when it can.
    precompute_unavailable: str | None
    # Why `cached_prefixes` cannot run on this handle (a sentence the console shows), or None when it can.
    cached_prefixes_unavailable: str | None
    # Prometheus collectors of the handle's own series (replicas: per-replica shares), registered by /metrics
    # beside the series every handle has; () for none.
    prometheus_collectors: tuple

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 cache_salt: str | None = None, affinity_key: str | None = None,
                 options: RequestOptions = DEFAULT_REQUEST_OPTIONS) -> AsyncIterator[RequestOutput]:
        """Yields one RequestOutput per step the request advanced; the last carries finish_reason.
        Raises RequestError when the engine refuses the request. Leaving the iteration early (client gone)
        aborts the request. `affinity_key` (prompt_cache_key) is a routing hint for replicas."""
        ...

    def abort(self, request_id: str) -> None:
        """Drop the request; its pages go back before the next step."""
        ...

    def pin(self, token_ids: list[int], cache_salt: str | None, seconds: float) -> None:
        """Keep this prefix's cached pages from eviction for `seconds` (fire and forget)."""
        ...

    async def precompute_documents(self, token_id_lists: list[list[int]], cache_salt: str | None = None,
                                   context_token_id_lists: list[list[int]] | None = None) -> int:
        """Store each list's span KV, computed after its context when given (LLMEngine.precompute_documents);
        returns the prompt tokens computed. Raises RequestError when a list can never be served, or when
        `precompute_unavailable` is set."""
        ...

    async def cached_prefixes(self, cache_salt: str | None, limit: int) -> tuple[float, list[CachedPrefix]]:
        """(when read, the `limit` longest cached prefixes of tenant `cache_salt`), read between engine steps
        (engine/cached_prefixes.py). Raises RequestError when `cached_prefixes_unavailable` is set."""
        ...

    def stats(self) -> EngineStats:
        """The latest snapshot (never blocks on the engine)."""
        ...

    def shutdown(self) -> None:
        """Stop the engine(s) and let go of their resources; blocks."""
        ...

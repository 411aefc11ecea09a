"""The ingress's engine handle (engine/engine_handle.py's EngineHandle), served by replicas through Ray Serve.

The server (server/app.py's create_app with this as its engine) uses exactly what the contract
names: generate (an async iterator of RequestOutput; leaving it early aborts), abort,
pin, stats(), metrics (latency series the server's histograms listen to) and `facts` (the
model facts, one replica's). Each request's prompt ids become a ReplicaWork with the prompt's chained page
hashes, sent through a Ray Serve streaming DeploymentHandle; the prefix router picks the
replica. Only token ids and page hashes travel, never KV.

Failures: a replica that dies before its first output is retried once (the router has
dropped it by then, or Ray Serve tries another); one that dies mid-stream fails the request
with a clear error. Latencies (TTFT, ITL, e2e) are measured here, at the ingress.

Document KV (`precompute_documents`, a collection's chunks as they are added): every live replica
computes it into its own store, and its own disk directory (replicas share a KV disk root, each
locks its own `<fingerprint>-i`), since any replica may serve a question about them. That needs
the prefix router, which sends each replica its share; with `--replica-router pow2` precompute is
skipped, and `precompute_unavailable` says why (the collections API passes it on).
"""

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from cache.page_hash import ROOT_PAGE_HASH, hash_pages
from engine.cached_prefixes import CachedPrefix
from engine.engine_handle import EngineFacts
from engine.errors import RequestError
from engine.metrics import EngineMetrics, EngineStats
from engine.stats_table import sum_stats
from engine.request import RequestOutput
from engine.request_options import DEFAULT_REQUEST_OPTIONS, RequestOptions
from engine.sampling_params import SamplingParams
from replicas.replica_metrics import ReplicaStatsCollector
from replicas.routing_state import RoutingState
from replicas.session_key import current_session_key
from replicas.work import PrecomputeWork, ReplicaWork, split_grammars

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

logger = logging.getLogger("radixserve.replicas")

NUM_START_ATTEMPTS = 2  # a replica that dies before streaming anything: try once more elsewhere


def _replica_gone() -> tuple[type[BaseException], ...]:
    """Ray's errors for a replica that died. Imported when first needed, so that this module (the
    EngineHandle conformance test reads it) imports without Ray; a live handle has Ray loaded already."""
    from ray.exceptions import ActorUnavailableError, RayActorError

    return RayActorError, ActorUnavailableError


class ReplicaFailed(RuntimeError):
    """The replica serving a request died after it had streamed part of the answer."""


class ReplicaEngine:
    """N engine replicas behind Ray Serve: an engine.engine_handle.EngineHandle."""

    def __init__(self, handle: "DeploymentHandle", facts: EngineFacts, routing: RoutingState,
                 can_target_replicas: bool = True):
        """`can_target_replicas`: the prefix router routes the handle (a PrecomputeWork reaches its replica)."""
        self.facts = facts
        self.precompute_unavailable = None if can_target_replicas else (
            "with --replica-router pow2 a collection's document KV cannot be sent to every replica; "
            "use the prefix router to precompute it")
        self.cached_prefixes_unavailable = ("this server's engine handle does not show its radix tree "
                                            "(with --replicas each replica has its own)")
        self.routing = routing
        self.metrics = EngineMetrics()
        self.prometheus_collectors = (ReplicaStatsCollector(routing),)
        self._handle = handle.options(stream=True)
        self._pin_handle = handle.options(stream=False)
        self._streams: dict[str, object] = {}  # request_id -> DeploymentResponseGenerator in flight
        self._num_pins = itertools.count()

    @classmethod
    def connect(cls, handle: "DeploymentHandle", routing: RoutingState,
                can_target_replicas: bool = True) -> "ReplicaEngine":
        """Blocking (call it off the event loop): asks one replica for the model facts, and seeds the
        stats with its report until the router hands over every replica's."""
        facts = handle.model_facts.remote().result()
        report = handle.record_routing_stats.remote().result()
        routing.sync_replicas({report["replica_id"]: report})
        return cls(handle, facts, routing, can_target_replicas)

    def _work(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
              cache_salt: str | None, affinity_key: str | None,
              options: RequestOptions = DEFAULT_REQUEST_OPTIONS) -> ReplicaWork:
        params, grammars = split_grammars(params)
        page_hashes = hash_pages(ROOT_PAGE_HASH, prompt_token_ids, self.facts.page_size, cache_salt)
        return ReplicaWork(request_id, list(prompt_token_ids), params, cache_salt, grammars, page_hashes,
                           affinity_key if affinity_key is not None else current_session_key.get(), options,
                           self.routing)

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       cache_salt: str | None = None, affinity_key: str | None = None,
                       options: RequestOptions = DEFAULT_REQUEST_OPTIONS) -> AsyncIterator[RequestOutput]:
        """As AsyncEngine.generate; `affinity_key` (prompt_cache_key) defaults to the session header."""
        work = self._work(request_id, prompt_token_ids, params, cache_salt, affinity_key, options)
        arrival = time.perf_counter()
        last_token_time = None
        for attempt in range(NUM_START_ATTEMPTS):
            stream = self._handle.generate.remote(work)
            self._streams[request_id] = stream
            finished = False
            num_outputs = 0
            try:
                async for reply in stream:
                    if reply.refusal is not None:
                        finished = True
                        raise RequestError(reply.refusal)
                    output = reply.output
                    now = time.perf_counter()
                    if last_token_time is None:
                        self.metrics.observe("time_to_first_token", now - arrival)
                    elif output.new_token_ids:
                        self.metrics.observe("inter_token_latency", now - last_token_time)
                    last_token_time = now
                    num_outputs += 1
                    if output.finish_reason is not None:
                        finished = True
                        self.metrics.observe("e2e_latency", now - arrival)
                    yield output
                    if finished:
                        return
                finished = True  # the stream ended without a last output: the replica was stopped
                raise ReplicaFailed(f"replica stream for request {request_id} ended early")
            except _replica_gone() as error:
                finished = True
                if num_outputs == 0 and attempt + 1 < NUM_START_ATTEMPTS:
                    logger.warning("radixserve: replica died before request %s started; retrying: %s",
                                   request_id, type(error).__name__)
                    continue
                raise ReplicaFailed(f"the replica serving request {request_id} died: {type(error).__name__}") from None
            finally:
                self._streams.pop(request_id, None)
                if not finished:  # the consumer left early (client gone): stop it on its replica
                    stream.cancel()

    def abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.cancel()

    def pin(self, token_ids: list[int], cache_salt: str | None, seconds: float) -> None:
        """Sent to the replica the router finds holding this prefix (fire and forget)."""
        work = self._work(f"pin-{next(self._num_pins)}", token_ids, SamplingParams(), cache_salt, None)
        self._pin_handle.pin.remote(work, seconds)

    async def cached_prefixes(self, cache_salt: str | None, limit: int) -> tuple[float, list[CachedPrefix]]:
        """Each replica has its own tree: refused (`cached_prefixes_unavailable`)."""
        raise RequestError(self.cached_prefixes_unavailable)

    async def precompute_documents(self, token_id_lists: list[list[int]], cache_salt: str | None = None,
                                   context_token_id_lists: list[list[int]] | None = None) -> int:
        """Every live replica stores the lists' span KV, each computed after its context if given
        (LLMEngine.precompute_documents); returns the
        prompt tokens computed, summed over the replicas. Raises RequestError with a replica's refusal.
        The router learns of every replica when it routes the first share, so shares go out until each
        replica known has had one; a replica that dies meanwhile is skipped."""
        if self.precompute_unavailable is not None:
            raise RequestError(self.precompute_unavailable)
        lists = [list(token_ids) for token_ids in token_id_lists]
        contexts = None if context_token_id_lists is None else [list(ids) for ids in context_token_id_lists]
        done: set[str] = set()
        num_computed = 0
        while todo := sorted(set(self.routing.stats_by_replica()) - done):
            done.update(todo)
            shares = [self._pin_handle.precompute.remote(
                PrecomputeWork(replica_id, lists, cache_salt, self.routing, contexts)) for replica_id in todo]
            for replica_id, result in zip(todo, await asyncio.gather(*shares, return_exceptions=True)):
                if isinstance(result, BaseException):
                    if not isinstance(result, _replica_gone()):
                        raise result
                    logger.warning("radixserve: replica %s died during a precompute; its replacement computes "
                                   "those documents when a prompt first holds them", replica_id)
                    continue
                num_tokens, refusal = result
                if refusal is not None:
                    raise RequestError(refusal)
                num_computed += num_tokens
        return num_computed

    def stats(self) -> EngineStats:
        """Summed over the live replicas' latest reports (Ray Serve routing stats, ~1 s old)."""
        by_replica = self.routing.stats_by_replica().values()
        return sum_stats(EngineStats, by_replica)

    def shutdown(self) -> None:
        for stream in list(self._streams.values()):
            stream.cancel()
        self._streams.clear()

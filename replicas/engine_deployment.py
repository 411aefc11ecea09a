"""One engine replica as a Ray Serve deployment: an AsyncEngine with its own threads.

`generate` streams ReplicaReply items (Ray Serve streaming: an async generator method). When
the ingress stops reading (the client went away), Ray Serve cancels this generator, and
AsyncEngine.generate's exit aborts the request, whose pages go back before the next step.
`record_routing_stats` is Ray Serve's hook for what a replica tells the routers: here the
page hashes its tree holds (versioned) and its EngineStats.
"""

import dataclasses
import logging
from collections.abc import AsyncIterator

import torch
from ray import serve

from assembly.constrained_output import GrammarCompiler
from engine.async_engine import AsyncEngine
from engine.engine_handle import EngineFacts
from engine.engine_config import EngineConfig
from engine.errors import RequestError
from replicas.replica_pages import ReplicaPages
from replicas.work import PrecomputeWork, ReplicaReply, ReplicaWork

logger = logging.getLogger("radixserve.replicas")


class EngineReplica:
    def __init__(self, engine_config: EngineConfig, num_threads: int):
        torch.set_num_threads(num_threads)
        self.engine = AsyncEngine.from_config(engine_config)
        self.pages = ReplicaPages()
        self.engine.engine.scheduler.tree.page_listeners.append(self.pages.on_event)  # told on the engine thread
        facts = self.engine.facts
        self.grammars = GrammarCompiler(engine_config.model_dir / "tokenizer.json", sorted(facts.eos_token_ids),
                                        facts.vocab_size)
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        logger.info("radixserve: replica %s ready (%d threads)", self.replica_id, num_threads)

    async def generate(self, work: ReplicaWork) -> AsyncIterator[ReplicaReply]:
        params = work.params
        if work.grammars:
            processors = tuple(self.grammars.processor(grammar) for grammar in work.grammars)
            params = dataclasses.replace(params, logits_processors=processors)
        try:
            async for output in self.engine.generate(work.request_id, work.prompt_token_ids, params, work.cache_salt,
                                                      options=work.options):
                yield ReplicaReply(self.replica_id, output=output)
        except RequestError as error:
            yield ReplicaReply(self.replica_id, refusal=str(error))

    async def precompute(self, work: PrecomputeWork) -> tuple[int, str | None]:
        """(tokens computed, None) into this replica's document store, or (0, the engine's refusal)."""
        try:
            return await self.engine.precompute_documents(work.token_id_lists, work.cache_salt,
                                                         work.context_token_id_lists), None
        except RequestError as error:
            return 0, str(error)

    def pin(self, work: ReplicaWork, seconds: float) -> None:
        self.engine.pin(work.prompt_token_ids, work.cache_salt, seconds)

    def model_facts(self) -> EngineFacts:
        return self.engine.facts

    def record_routing_stats(self) -> dict:
        version, page_hashes = self.pages.snapshot()
        return {"replica_id": self.replica_id, "page_hashes_version": version, "page_hashes": page_hashes,
                "engine_stats": dataclasses.asdict(self.engine.stats())}

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()

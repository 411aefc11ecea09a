"""The Litestar application: `create_app(settings)` is the one place it is put together.

Resources (engine thread, tokenizer, chat template, metrics) are opened in the
lifespan and kept on `app.state`:
    settings   ServerSettings
    generation_defaults  ResolvedGenerationDefaults (what a request leaves out, and where each came from)
    engine     the engine handle (engine/engine_handle.py: AsyncEngine, or replicas' ReplicaEngine)
    service    CompletionService
    metrics    ServerMetrics
    logprobs   LogprobFormatter
    started_at unix seconds the model became ready
    retrieval  RetrievalService (collections, embeddings; its model loads on first use)
    prompt_ledger  PromptLedger (recent prompts by response id, for cache diagnostics)
    response_store ResponseStore (stored Responses, SQLite)
    message_threads ResponseStore (Anthropic's message threads, same file, own table)
    thread_continuations ThreadContinuations (the threads' replies being continued now)
    request_records RequestRecords (recent chat requests and their prompt tokens' origins, for the console)

With `ui` (serve --ui, the default) GET / is the web console (server/routes_console.py).
GET /openapi.json is the OpenAPI document of these routes (server/openapi.py); with
`allowed_origins` (serve --allowed-origins) browsers on those origins may call the API (CORS).
"""

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from importlib.metadata import version

from litestar import Litestar, Router
from litestar.config.cors import CORSConfig
from litestar.datastructures import State

from assembly.chat_template import ChatTemplate
from assembly.constrained_output import GrammarCompiler
from assembly.generated_turns import GeneratedTurns
from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import SegmentTokenizer
from assembly.tokenizer import Tokenizer
from engine.async_engine import AsyncEngine
from engine.engine_handle import EngineHandle
from engine.engine_config import EngineConfig
from server.access_log import AccessLogMiddleware
from server.api_anthropic.errors import EXCEPTION_HANDLERS_BY_API
from server.api_anthropic.routes import ANTHROPIC_ROUTES
from server.api_responses.routes import RESPONSES_ROUTES
from server.auth import require_api_key
from server.completion_service import CompletionService
from server.generation_defaults import resolve_generation_defaults
from server.logprobs import LogprobFormatter
from server.metrics import ServerMetrics
from server.openapi import document_responses, openapi_config, openapi_document
from server.prompt_ledger import PromptLedger
from server.prompts import RequestPrompts
from server.request_records import RequestRecords
from server.api_anthropic.threads import THREADS_TABLE, ThreadContinuations
from server.response_store import ResponseStore
from server.retrieval_service import RetrievalService
from server.routes_chat import chat_completions
from server.routes_collections import COLLECTION_ROUTES
from server.routes_completions import completions
from server.routes_console import CONSOLE_API_ROUTES, CONSOLE_PAGE_ROUTES
from server.routes_embeddings import embeddings
from server.routes_misc import get_model, health, list_models, metrics
from server.settings import ServerSettings

EngineFactory = Callable[[EngineConfig], EngineHandle]

logger = logging.getLogger("radixserve.server")


def create_app(settings: ServerSettings, engine_factory: EngineFactory = AsyncEngine.from_config) -> Litestar:
    """`engine_factory` builds the engine in the lifespan (tests pass a fake one)."""

    @asynccontextmanager
    async def open_resources(app: Litestar) -> AsyncIterator[None]:
        model_dir = settings.engine.model_dir
        generation_defaults = resolve_generation_defaults(settings.generation_defaults, model_dir)
        logger.info("radixserve: defaults for what a request leaves out: %s", generation_defaults.describe())
        tokenizer = Tokenizer(model_dir)
        chat_template = ChatTemplate.from_model_dir(model_dir, settings.chat_template_path)
        engine = await asyncio.to_thread(engine_factory, settings.engine)  # loads weights: seconds
        server_metrics = ServerMetrics(engine)
        # The embedding model runs on the engine's thread where the engine is in this process (one OpenMP team)
        retrieval = RetrievalService(settings.collections_dir, compute=getattr(engine, "run_compute", None))
        responses = ResponseStore(settings.responses_db, settings.responses_max_count, settings.responses_max_bytes,
                                  settings.responses_max_age_seconds)
        message_threads = ResponseStore(settings.responses_db, settings.responses_max_count,
                                        settings.responses_max_bytes, settings.responses_max_age_seconds,
                                        table=THREADS_TABLE)
        try:
            app.state.retrieval = retrieval
            app.state.engine = engine
            app.state.metrics = server_metrics
            turns = GeneratedTurns()
            prompts = RequestPrompts(PromptBuilder(SegmentTokenizer(tokenizer), chat_template, turns))
            facts = engine.facts
            grammars = GrammarCompiler(tokenizer.path, sorted(facts.eos_token_ids), facts.vocab_size)
            app.state.generation_defaults = generation_defaults
            app.state.service = CompletionService(engine, prompts, grammars, settings, generation_defaults.values,
                                                  turns)
            app.state.logprobs = LogprobFormatter(tokenizer)
            app.state.prompt_ledger = PromptLedger()
            app.state.request_records = RequestRecords()
            app.state.response_store = responses
            app.state.message_threads = message_threads
            app.state.thread_continuations = ThreadContinuations()
            app.state.started_at = int(time.time())
            # What startup built (model, tokenizers, templates) lives as long as the server: kept out of
            # the collector's full passes, which otherwise walk it all and pause every thread.
            gc.freeze()
            yield
        finally:
            await retrieval.close()
            responses.close()
            message_threads.close()
            server_metrics.close()
            await asyncio.to_thread(engine.shutdown)

    api = Router("/v1", route_handlers=[chat_completions, completions, list_models, get_model, embeddings,
                                       *COLLECTION_ROUTES, *RESPONSES_ROUTES, *ANTHROPIC_ROUTES, *CONSOLE_API_ROUTES],
                 guards=[require_api_key])
    app = Litestar(
        route_handlers=[api, health, metrics, openapi_document, *(CONSOLE_PAGE_ROUTES if settings.ui else ())],
        lifespan=[open_resources],
        exception_handlers=EXCEPTION_HANDLERS_BY_API,
        request_max_body_size=settings.max_body_bytes,
        state=State({"settings": settings}),
        openapi_config=openapi_config(version("radixserve")),  # GET /openapi.json
        cors_config=_cors_config(settings.allowed_origins),
        logging_config=None,
    )
    document_responses(app.openapi_schema)  # error responses and media types the generator cannot see
    # Outermost, so the access log sees every request, routed or not.
    app.asgi_handler = AccessLogMiddleware(app.asgi_handler)
    return app


def _cors_config(allowed_origins: tuple[str, ...]) -> CORSConfig | None:
    """Browsers may call the API from these origins. A preflight (OPTIONS) is answered by the
    CORS middleware before any guard, so it needs no API key; the real request still does."""
    if not allowed_origins:
        return None
    return CORSConfig(allow_origins=list(allowed_origins), allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                      allow_headers=["*"], expose_headers=["Retry-After"], max_age=600)

"""POST /v1/chat/completions"""

import asyncio
import time

from litestar import Request, Response, post
from litestar.datastructures import State

from server.auth import caller_of
from server.cache_diagnostics import diagnose, openai_diagnostics_body, prompt_parts
from server.chat_translation import chat_job
from server.choice_stream import Usage
from server.completion_response import answer
from server.openapi import json_body
from server.rag_context import retrieve_context
from server.request_body import validated_body
from server.completion_shapes import ChatShapes, ResponseIdentity
from server.schemas import ChatCompletionRequest


@post("/chat/completions", status_code=200, operation_class=json_body(ChatCompletionRequest))
async def chat_completions(request: Request, state: State) -> Response:
    started = time.perf_counter()
    body = await validated_body(request, ChatCompletionRequest)
    identity = ResponseIdentity.new("chatcmpl", state.settings.served_model_name)
    context = await retrieve_context(state.retrieval, body, state.settings.rag_order) if body.retrieval else None
    caller = caller_of(request)
    spec = state.service.scoped(chat_job(body, context.documents if context else ()), caller)
    job = await state.service.prepare_off_loop(spec, identity.id, caller)
    extra_fields = {"retrieved_documents": context.reported} if context else {}
    # Recent prompts by id, so a later request can ask where it diverged from this one.
    owner = caller.owner(job.cache_salt)
    parts = prompt_parts(spec, identity.model, body.prompt_cache_key)
    if body.comparison_response_id is not None:
        previous = state.prompt_ledger.lookup(body.comparison_response_id, owner)
        sources = [f"messages[{i}]" for i in range(len(spec.messages))]
        diagnosis = await asyncio.to_thread(diagnose, previous, state.service.prompts, spec, job.prompt_token_ids,
                                            parts, sources)  # renders the prompt again, per message
        extra_fields["prompt_cache_diagnostics"] = openai_diagnostics_body(diagnosis)
    state.prompt_ledger.record(identity.id, owner, job.prompt_token_ids, parts)
    usage = Usage()
    shapes = ChatShapes(identity, state.logprobs, include_usage=body.include_usage_chunk,
                        extra_fields=extra_fields or None, running_usage=usage if body.usage_on_every_chunk else None)
    # GET /v1/requests/{id} reads it (the console's token bar)
    state.request_records.record(identity.id, caller.key_id, usage, job.num_choices,
                                 bool(job.engine_options.document_spans), started)
    return await answer(request, state.service, job, shapes, stream=body.stream,
                        include_usage=body.include_usage_chunk, usage=usage)

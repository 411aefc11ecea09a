"""POST /v1/chat/completions"""

import asyncio

from litestar import Request, Response, post
from litestar.datastructures import State

from server.completion_response import answer
from server.rag_context import retrieve_context
from server.responses import ChatShapes, ResponseIdentity
from server.schemas import ChatCompletionRequest


@post("/chat/completions", status_code=200)
async def chat_completions(request: Request, state: State) -> Response:
    # Validating, rendering and tokenizing a body of megabytes takes seconds: in a worker thread.
    body = await asyncio.to_thread(ChatCompletionRequest.model_validate_json, await request.body())
    identity = ResponseIdentity.new("chatcmpl", state.settings.served_model_name)
    context = await retrieve_context(state.retrieval, body, state.settings.rag_order) if body.retrieval else None
    job = await asyncio.to_thread(state.service.prepare_chat, body, identity.id, context.documents if context else ())
    extra_fields = {"retrieved_documents": context.reported} if context else None
    shapes = ChatShapes(identity, state.logprobs, include_usage=body.include_usage_chunk, extra_fields=extra_fields)
    return await answer(request, state.service, job, shapes, stream=body.stream,
                        include_usage=body.include_usage_chunk)

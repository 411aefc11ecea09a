"""POST /v1/completions (legacy text completions)"""

import asyncio

from litestar import Request, Response, post
from litestar.datastructures import State

from server.completion_response import answer
from server.responses import CompletionShapes, ResponseIdentity
from server.schemas import CompletionRequest


@post("/completions", status_code=200)
async def completions(request: Request, state: State) -> Response:
    # Validating, rendering and tokenizing a body of megabytes takes seconds: in a worker thread.
    body = await asyncio.to_thread(CompletionRequest.model_validate_json, await request.body())
    identity = ResponseIdentity.new("cmpl", state.settings.served_model_name)
    job = await asyncio.to_thread(state.service.prepare_completion, body, identity.id)
    shapes = CompletionShapes(identity, state.logprobs, include_usage=body.include_usage_chunk)
    return await answer(request, state.service, job, shapes, stream=body.stream,
                        include_usage=body.include_usage_chunk)

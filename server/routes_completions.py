"""POST /v1/completions (legacy text completions): one or more prompts, each with its n choices
(indexed prompt-major), and `echo` (server/completion_batch.py)."""

from litestar import Request, Response, post
from litestar.datastructures import State

from server.completion_batch import CompletionBatch, CompletionBatchRunner
from server.completion_response import answer
from server.openapi import json_body
from server.responses import CompletionShapes, ResponseIdentity
from server.schemas import CompletionRequest


@post("/completions", status_code=200, operation_class=json_body(CompletionRequest))
async def completions(request: Request, state: State) -> Response:
    body = CompletionRequest.model_validate_json(await request.body())
    identity = ResponseIdentity.new("cmpl", state.settings.served_model_name)
    jobs = state.service.prepare_completion(body, identity.id)
    echo_texts = None
    if body.echo:
        tokenizer = state.service.prompts.tokenizer
        echo_texts = tuple(p if isinstance(p, str) else tokenizer.decode(p, skip_special_tokens=False)
                           for p in body.prompt)
    batch = CompletionBatch(tuple(jobs), body.n, echo_texts)
    shapes = CompletionShapes(identity, state.logprobs, include_usage=body.include_usage_chunk)
    return await answer(request, CompletionBatchRunner(state.service), batch, shapes, stream=body.stream,
                        include_usage=body.include_usage_chunk)

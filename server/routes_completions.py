"""POST /v1/completions (legacy text completions): one or more prompts, each with its n choices
(indexed prompt-major), and `echo` (server/completion_batch.py)."""

import asyncio

from litestar import Request, Response, post
from litestar.datastructures import State

from server.choice_stream import Usage
from server.completion_batch import CompletionBatch, CompletionBatchRunner
from server.completion_response import answer
from server.errors import invalid_request
from server.openapi import json_body
from server.request_body import validated_body
from server.completion_shapes import CompletionShapes, ResponseIdentity
from server.schemas import CompletionRequest


@post("/completions", status_code=200, operation_class=json_body(CompletionRequest))
async def completions(request: Request, state: State) -> Response:
    body = await validated_body(request, CompletionRequest)
    identity = ResponseIdentity.new("cmpl", state.settings.served_model_name)
    jobs = await state.service.prepare_completion_off_loop(body, identity.id)
    echo_texts = tuple(await asyncio.to_thread(_prompt_texts, body.prompt, state)) if body.echo else None
    batch = CompletionBatch(tuple(jobs), body.n, echo_texts)
    usage = Usage()
    shapes = CompletionShapes(identity, state.logprobs, include_usage=body.include_usage_chunk,
                              running_usage=usage if body.usage_on_every_chunk else None)
    return await answer(request, CompletionBatchRunner(state.service), batch, shapes, stream=body.stream,
                        include_usage=body.include_usage_chunk, usage=usage)


def _prompt_texts(prompts: list[str] | list[list[int]], state: State) -> list[str]:
    """The prompts as text, for echo; token ids are checked against the vocabulary first (the
    engine would refuse them later; the tokenizer cannot decode them)."""
    tokenizer, vocab_size = state.service.prompts.tokenizer, state.engine.facts.vocab_size
    texts = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, list):
            bad = next((t for t in prompt if t >= vocab_size), None)
            if bad is not None:
                raise invalid_request(f"token id {bad} is outside the vocabulary [0, {vocab_size})",
                                      param="prompt" if len(prompts) == 1 else f"prompt[{i}]")
            prompt = tokenizer.decode(prompt, skip_special_tokens=False)
        texts.append(prompt)
    return texts

"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API), errors in its shape;
message threads (`thread`) are server/api_anthropic/threads.py's."""

import asyncio
from collections.abc import Callable

from litestar import Request, Response, post
from litestar.datastructures import State

from server.api_anthropic.schemas import CountTokensRequest, MessagesRequest
from server.api_anthropic.streaming import message_stream
from server.api_anthropic.threads import store_thread_turn, thread_to_continue
from server.api_anthropic.translation import TranslatedPrompt, message_body, messages_job, new_message_id
from server.api_anthropic.usage import usage_body
from server.auth import Caller, caller_of
from server.cache_diagnostics import Diagnosis, diagnose, prompt_parts
from server.choice_stream import ChoiceResult, Usage
from server.completion_response import StartedStream, run_job
from server.openapi import json_body
from server.request_body import validated_body
from server.response_store import StoredResponse

_MISS_TYPES = {"model": "model_changed", "system": "system_changed", "tools": "tools_changed"}


def _diagnostics_body(diagnosis: Diagnosis) -> dict:
    """`diagnostics`, as Anthropic shapes it; the first differing block and token are this server's own."""
    if diagnosis.cause == "hit":
        return {"cache_miss_reason": None}
    if diagnosis.cause == "not_found":
        return {"cache_miss_reason": {"type": "previous_message_not_found"}}
    return {"cache_miss_reason": {"type": _MISS_TYPES.get(diagnosis.cause, "messages_changed"),
                                  "cache_missed_input_tokens": diagnosis.num_missed_tokens,
                                  "first_differing_block": diagnosis.block,
                                  "first_differing_token": diagnosis.position}}


@post("/messages", status_code=200, operation_class=json_body(MessagesRequest))
async def create_message(request: Request, state: State) -> Response:
    body = await validated_body(request, MessagesRequest)
    caller = caller_of(request)
    service = state.service
    service.check_model(body.model)
    salt = caller.cache_salt(None)
    owner = caller.owner(salt)
    threads = state.message_threads
    previous, release_thread = await thread_to_continue(threads, state.thread_continuations, body, owner,
                                                        service.turns, caller.turn_scope(salt, None))
    try:
        return await _answer(request, state, body, caller, owner, previous, release_thread)
    except BaseException:
        release_thread()
        raise


async def _answer(request: Request, state: State, body: MessagesRequest, caller: Caller, owner: str,
                  previous: StoredResponse | None, release_thread: Callable[[], None]) -> Response:
    """The reply; a continuation's claim is released once the reply is stored (or the stream closes)."""
    service = state.service
    threads = state.message_threads
    prompt = TranslatedPrompt(body, previous)
    chat_job = service.scoped(messages_job(body, prompt), caller)
    message_id = new_message_id()
    job = await service.prepare_off_loop(chat_job, message_id, caller)
    parts = prompt_parts(chat_job, body.model)
    diagnostics = None
    if body.diagnostics is not None:
        previous_id = body.diagnostics.previous_message_id
        compared = state.prompt_ledger.lookup(previous_id, owner) if previous_id is not None else None
        if previous_id is None:
            diagnostics = {"cache_miss_reason": None}  # opted in, nothing to compare with yet
        else:
            diagnosis = await asyncio.to_thread(diagnose, compared, service.prompts, chat_job, job.prompt_token_ids,
                                                parts, prompt.sources)  # renders the prompt again, per message
            diagnostics = _diagnostics_body(diagnosis)
    state.prompt_ledger.record(message_id, owner, job.prompt_token_ids, parts)

    usage = Usage()
    page_size = service.engine.facts.page_size
    model = body.model

    def final_usage() -> dict:
        return usage_body(usage, job, page_size)

    async def finish(result: ChoiceResult) -> dict:
        final = message_body(message_id, model, result, usage, job, page_size, diagnostics)
        if body.thread is not None:
            await asyncio.to_thread(store_thread_turn, threads, owner, final, prompt, previous, result,
                                    job.prompt_token_ids)
        release_thread()  # stored: a continuation from the same reply now reads "already continued"
        return final

    outcome = await run_job(request, service, job, usage, stream=body.stream)
    if isinstance(outcome, Response):
        release_thread()
        return outcome
    if isinstance(outcome, StartedStream):
        start = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
                 "stop_reason": None, "stop_sequence": None, "usage": {**final_usage(), "output_tokens": 0}}
        if diagnostics is not None:
            start["diagnostics"] = diagnostics
        return message_stream(start, outcome.first, outcome.deltas, final_usage, finish, on_close=release_thread)
    try:
        return Response(await finish(outcome[0]), status_code=200)
    finally:
        release_thread()


@post("/messages/count_tokens", status_code=200, operation_class=json_body(CountTokensRequest))
async def count_tokens(request: Request, state: State) -> Response:
    body = await validated_body(request, CountTokensRequest)
    state.service.check_model(body.model)
    # Scoped as /v1/messages is, so the count splices the same remembered turns.
    job = state.service.scoped(messages_job(body, TranslatedPrompt(body)), caller_of(request))
    num_tokens = await asyncio.to_thread(state.service.prompts.count_tokens, job)  # renders and tokenizes
    return Response({"input_tokens": num_tokens}, status_code=200)


ANTHROPIC_ROUTES = [create_message, count_tokens]

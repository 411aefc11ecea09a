"""POST /v1/responses, GET and DELETE /v1/responses/{id} (OpenAI's Responses API)."""

import asyncio

from litestar import Request, Response, delete, get, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery

from server.api_responses.schemas import ResponsesRequest
from server.api_responses.shapes import ResponseShapes, response_stream
from server.api_responses.translation import (new_response_id, remember_stored_turns, responses_job,
                                              responses_prompt)
from server.auth import caller_of
from server.cache_diagnostics import diagnose, openai_diagnostics_body, prompt_parts
from server.choice_stream import ChoiceResult, Usage
from server.completion_response import StartedStream, run_job
from server.errors import APIError
from server.openapi import json_body
from server.request_body import validated_body
from server.response_store import conversation_turn


def _not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"no response with id {response_id!r} (or not visible to this key)", param=param,
                    code="response_not_found")


@post("/responses", status_code=200, operation_class=json_body(ResponsesRequest))
async def create_response(request: Request, state: State) -> Response:
    body = await validated_body(request, ResponsesRequest)
    caller = caller_of(request)
    service, store = state.service, state.response_store
    owner = caller.owner(caller.cache_salt(body.cache_salt))
    previous = None
    if body.previous_response_id is not None:
        previous = await asyncio.to_thread(store.get, body.previous_response_id, owner)
        if previous is None:
            raise _not_found(body.previous_response_id, "previous_response_id")
        remember_stored_turns(service.turns, previous,
                              caller.turn_scope(caller.cache_salt(body.cache_salt), body.prompt_cache_key))
    prompt = responses_prompt(body, previous)
    chat_job = service.scoped(responses_job(body, prompt), caller)
    response_id = new_response_id()
    job = await service.prepare_off_loop(chat_job, response_id, caller)
    model = body.model or state.settings.served_model_name
    parts = prompt_parts(chat_job, model, body.prompt_cache_key)
    extra = {}
    if body.prompt_cache_options is not None:
        extra["prompt_cache_options"] = body.prompt_cache_options.model_dump()
        if (comparison_id := body.prompt_cache_options.comparison_response_id) is not None:
            compared = state.prompt_ledger.lookup(comparison_id, owner)
            diagnosis = await asyncio.to_thread(diagnose, compared, service.prompts, chat_job, job.prompt_token_ids,
                                                parts, prompt.sources)  # renders the prompt again, per message
            extra["prompt_cache_diagnostics"] = openai_diagnostics_body(diagnosis)
    state.prompt_ledger.record(response_id, owner, job.prompt_token_ids, parts)
    shapes = ResponseShapes(response_id, model, body)
    usage = Usage()

    async def finish(result: ChoiceResult) -> dict:
        final = shapes.final(result, usage, job, extra)
        if body.store is not False:
            await asyncio.to_thread(_store, store, owner, final, prompt, previous, result, job.prompt_token_ids)
        return final

    outcome = await run_job(request, service, job, usage, stream=bool(body.stream))
    if isinstance(outcome, Response):
        return outcome
    if isinstance(outcome, StartedStream):
        return response_stream(shapes, outcome.first, outcome.deltas, finish)
    return Response(await finish(outcome[0]), status_code=200)


def _store(store, owner: str, final: dict, prompt, previous, result: ChoiceResult, prompt_ids: list[int]) -> None:
    """The conversation this response ended, with the generated ids of every turn in it."""
    output_message, turn = conversation_turn(result)
    turns = (previous.turns if previous is not None else []) + [turn]
    store.put(owner, final, prompt.conversation + [output_message], turns, prompt_ids)


@get("/responses/{response_id:str}")
async def get_response(request: Request, state: State, response_id: FromPath[str],
                       cache_salt: FromQuery[str | None] = None) -> Response:
    stored = await asyncio.to_thread(state.response_store.get, response_id, _owner(request, cache_salt))
    if stored is None:
        raise _not_found(response_id)
    return Response(stored.body, status_code=200)


@delete("/responses/{response_id:str}", status_code=200)
async def delete_response(request: Request, state: State, response_id: FromPath[str],
                       cache_salt: FromQuery[str | None] = None) -> Response:
    if not await asyncio.to_thread(state.response_store.delete, response_id, _owner(request, cache_salt)):
        raise _not_found(response_id)
    return Response({"id": response_id, "object": "response", "deleted": True}, status_code=200)


def _owner(request: Request, cache_salt: str | None) -> str:
    """GET and DELETE carry no body: a response stored under a cache_salt is named by `?cache_salt=`."""
    caller = caller_of(request)
    return caller.owner(caller.cache_salt(cache_salt or None))


RESPONSES_ROUTES = [create_response, get_response, delete_response]

"""Runs a prepared job and answers: one JSON body, or an SSE stream.

`run_job` is the flow every API shares: the access log's record, waiting for
the results (or a stream's first delta) while watching for the client leaving.
A stream's headers go out only with its first delta, so a request the engine
refuses (too long, ids outside the vocabulary) still gets its 400 rather than a
200 with an error inside. `answer` is Chat Completions' and legacy completions'
use of it; their shapes differ, the flow does not.
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from litestar import Request, Response

from server.access_log import access_record
from server.completion_service import ChoiceDelta, ChoiceResult, Usage
from server.disconnect import CLIENT_CLOSED_REQUEST, ClientDisconnected, until_disconnected
from server.completion_shapes import ChatShapes, CompletionShapes
from server.streaming import sse_response


class Job(Protocol):
    request_id: str
    num_choices: int


class Runner(Protocol):
    """CompletionService (a GenerationJob), or CompletionBatchRunner (a CompletionBatch)."""

    def generate(self, job, usage: Usage) -> AsyncIterator[ChoiceDelta]: ...

    async def complete(self, job, usage: Usage) -> list[ChoiceResult]: ...


@dataclass(frozen=True)
class StartedStream:
    first: ChoiceDelta
    deltas: AsyncIterator[ChoiceDelta]  # the rest; the response's events must close it


async def run_job(request: Request, service: Runner, job: Job, usage: Usage, *,
                  stream: bool) -> list[ChoiceResult] | StartedStream | Response:
    """The whole results, or a stream whose engine request was accepted, or the empty answer to a
    client that went away."""
    record = access_record(request)
    record.request_id, record.usage = job.request_id, usage
    if not stream:
        try:
            return await until_disconnected(request, service.complete(job, usage))
        except ClientDisconnected:
            return Response(b"", status_code=CLIENT_CLOSED_REQUEST)

    deltas = service.generate(job, usage)
    try:
        first = await until_disconnected(request, anext(deltas, None))
    except ClientDisconnected:
        await deltas.aclose()
        return Response(b"", status_code=CLIENT_CLOSED_REQUEST)
    except BaseException:
        await deltas.aclose()
        raise
    if first is None:
        raise RuntimeError(f"engine stream {job.request_id} ended without output")
    return StartedStream(first, deltas)


async def answer(request: Request, service: Runner, job: Job,
                 shapes: ChatShapes | CompletionShapes, *, stream: bool, include_usage: bool,
                 usage: Usage | None = None) -> Response:
    """`usage`: the one to fill, when the caller keeps it: the shapes report it on every chunk
    (continuous_usage_stats), server/request_records.py reads it (the console)."""
    usage = usage if usage is not None else Usage()
    outcome = await run_job(request, service, job, usage, stream=stream)
    if isinstance(outcome, Response):
        return outcome
    if isinstance(outcome, StartedStream):
        return sse_response(shapes, outcome.first, outcome.deltas, job.num_choices, usage, include_usage)
    return Response(shapes.completion(outcome, usage), status_code=200)

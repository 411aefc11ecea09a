"""Runs a prepared job and answers: one JSON body, or an SSE stream.

Shared by /v1/chat/completions and /v1/completions; their shapes differ, the
flow does not. A stream's headers go out only with its first delta, so a
request the engine refuses (too long, ids outside the vocabulary) still gets
its 400 rather than a 200 with an error inside.
"""

from collections.abc import AsyncIterator
from typing import Protocol

from litestar import Request, Response

from server.access_log import access_record
from server.completion_service import ChoiceDelta, ChoiceResult, Usage
from server.disconnect import CLIENT_CLOSED_REQUEST, ClientDisconnected, until_disconnected
from server.responses import ChatShapes, CompletionShapes
from server.streaming import sse_response


class Job(Protocol):
    request_id: str
    num_choices: int


class Runner(Protocol):
    """CompletionService (a GenerationJob), or CompletionBatchRunner (a CompletionBatch)."""

    def generate(self, job, usage: Usage) -> AsyncIterator[ChoiceDelta]: ...

    async def complete(self, job, usage: Usage) -> list[ChoiceResult]: ...


async def answer(request: Request, service: Runner, job: Job,
                 shapes: ChatShapes | CompletionShapes, *, stream: bool, include_usage: bool) -> Response:
    usage = Usage()
    record = access_record(request)
    record.request_id, record.usage = job.request_id, usage
    if not stream:
        try:
            results = await until_disconnected(request, service.complete(job, usage))
        except ClientDisconnected:
            return Response(b"", status_code=CLIENT_CLOSED_REQUEST)
        return Response(shapes.completion(results, usage), status_code=200)

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
    return sse_response(shapes, first, deltas, job.num_choices, usage, include_usage)

"""Server-sent events for streamed completions, through Litestar's SSE response.

Framing as OpenAI's: `data: <json>\\n\\n` per chunk, `data: [DONE]\\n\\n` last.
Order per response: a role chunk per choice (chat only), content chunks (empty
deltas are skipped), one chunk with `finish_reason` and an empty delta per
choice, the usage chunk (`choices: []`) when stream_options.include_usage,
then [DONE]. An error after the headers went out becomes an error event,
then [DONE].

The client going away: Litestar cancels the task that drives the stream; the
cancellation reaches the engine stream inside, whose closing aborts the
request. If the stream was parked at a `yield` instead, the response's
background task closes the event generator, which closes the engine streams.
"""

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from litestar.background_tasks import BackgroundTask
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from server.completion_service import ChoiceDelta, Usage
from server.errors import SERVER_ERROR, error_body
from server.completion_shapes import ChatShapes, CompletionShapes

logger = logging.getLogger("radixserve.server")


def _event(body: dict | str) -> ServerSentEventMessage:
    data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return ServerSentEventMessage(data=data, sep="\n")


async def _events(shapes: ChatShapes | CompletionShapes, first: ChoiceDelta, deltas: AsyncIterator[ChoiceDelta],
                  num_choices: int, usage: Usage, include_usage: bool) -> AsyncIterator[ServerSentEventMessage]:
    async with aclosing(deltas):
        try:
            for index in range(num_choices):
                if (chunk := shapes.role_chunk(index)) is not None:
                    yield _event(chunk)
            delta = first
            while delta is not None:
                if delta.text or delta.logprobs or delta.tool_calls:
                    yield _event(shapes.content_chunk(delta))
                if delta.finish_reason is not None:
                    yield _event(shapes.finish_chunk(delta.index, delta.finish_reason))
                delta = await anext(deltas, None)
            if include_usage:
                yield _event(shapes.usage_chunk(usage))
        except Exception:  # the status line went out long ago: report in-band
            logger.exception("stream %s failed", shapes.identity.id)
            yield _event(error_body("internal server error while streaming", SERVER_ERROR))
    yield _event("[DONE]")


def sse_response(shapes: ChatShapes | CompletionShapes, first: ChoiceDelta, deltas: AsyncIterator[ChoiceDelta],
                 num_choices: int, usage: Usage, include_usage: bool) -> ServerSentEvent:
    """The SSE response of a stream whose first delta has arrived (so the engine accepted it)."""
    events = _events(shapes, first, deltas, num_choices, usage, include_usage)
    return ServerSentEvent(events, background=BackgroundTask(events.aclose))

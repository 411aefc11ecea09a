"""A Messages stream in Anthropic's event sequence, from the job's choice deltas.

    message_start (the message, empty content, input usage) - ping
    per content block: content_block_start - content_block_delta (text_delta |
        input_json_delta) ... - content_block_stop
    message_delta (stop_reason, stop_sequence, usage) - message_stop

Framing as Anthropic's: `event: <type>` and `data: <json>` per event. Text
that is only whitespace is held until something else arrives: a turn of tool
calls only has no text block, as in the non-streamed body. An error after the
headers went out becomes an `error` event.
"""

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing

from litestar.background_tasks import BackgroundTask
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from server.api_anthropic.translation import stop_reason
from server.choice_stream import ChoiceDelta, ChoiceResult

logger = logging.getLogger("radixserve.server")


def _event(body: dict) -> ServerSentEventMessage:
    return ServerSentEventMessage(data=json.dumps(body, ensure_ascii=False, separators=(",", ":")),
                                  event=body["type"], sep="\n")


class _Blocks:
    """Content blocks as deltas arrive: which one is open, what to send to open or close one."""

    def __init__(self):
        self.num_blocks = 0
        self.open_kind: str | None = None  # "text" | "tool_use"
        self.held_text = ""  # whitespace not yet given to a block

    def _close(self) -> list[dict]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        self.num_blocks += 1
        return [{"type": "content_block_stop", "index": self.num_blocks - 1}]

    def text(self, text: str) -> list[dict]:
        if self.open_kind != "text" and not (self.held_text + text).strip():
            self.held_text += text
            return []
        events = []
        if self.open_kind != "text":
            events += self._close()
            events.append({"type": "content_block_start", "index": self.num_blocks,
                           "content_block": {"type": "text", "text": ""}})
            self.open_kind = "text"
            text, self.held_text = self.held_text + text, ""
        return events + [{"type": "content_block_delta", "index": self.num_blocks,
                          "delta": {"type": "text_delta", "text": text}}]

    def tool_call(self, call) -> list[dict]:
        events = []
        if call.id is not None:
            self.held_text = ""  # whitespace before a call is not content
            events += self._close()
            events.append({"type": "content_block_start", "index": self.num_blocks,
                           "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}})
            self.open_kind = "tool_use"
        if call.arguments:
            events.append({"type": "content_block_delta", "index": self.num_blocks,
                           "delta": {"type": "input_json_delta", "partial_json": call.arguments}})
        return events

    def finish(self, has_calls: bool) -> list[dict]:
        events = []
        if self.held_text and not has_calls and self.open_kind is None:  # whitespace only: still the answer
            events = [{"type": "content_block_start", "index": self.num_blocks,
                       "content_block": {"type": "text", "text": ""}},
                      {"type": "content_block_delta", "index": self.num_blocks,
                       "delta": {"type": "text_delta", "text": self.held_text}}]
            self.open_kind, self.held_text = "text", ""
        return events + self._close()


async def _events(start_message: dict, first: ChoiceDelta, deltas: AsyncIterator[ChoiceDelta],
                  final_usage: Callable[[], dict],
                  finish: Callable[[ChoiceResult], Awaitable[None]] | None) -> AsyncIterator[ServerSentEventMessage]:
    """`finish(result)` runs once the turn is done, before `message_delta` (a thread stores its reply there)."""
    result = ChoiceResult(0)
    async with aclosing(deltas):
        try:
            yield _event({"type": "message_start", "message": start_message})
            yield _event({"type": "ping"})
            blocks = _Blocks()
            has_calls = False
            delta = first
            while delta is not None:
                result.add(delta)
                for body in blocks.text(delta.text) if delta.text else ():
                    yield _event(body)
                for call in delta.tool_calls:
                    has_calls = True
                    for body in blocks.tool_call(call):
                        yield _event(body)
                if delta.finish_reason is not None:
                    for body in blocks.finish(has_calls):
                        yield _event(body)
                    if finish is not None:
                        await finish(result)
                    yield _event({"type": "message_delta",
                                  "delta": {"stop_reason": stop_reason(delta.finish_reason, delta.stop_string),
                                            "stop_sequence": delta.stop_string},
                                  "usage": final_usage()})
                    yield _event({"type": "message_stop"})
                delta = await anext(deltas, None)
        except Exception:  # the status line went out long ago: report in-band
            logger.exception("stream %s failed", start_message["id"])
            yield _event({"type": "error", "error": {"type": "api_error",
                                                     "message": "internal server error while streaming"}})


def message_stream(start_message: dict, first: ChoiceDelta, deltas: AsyncIterator[ChoiceDelta],
                   final_usage: Callable[[], dict],
                   finish: Callable[[ChoiceResult], Awaitable[None]] | None = None,
                   on_close: Callable[[], None] = lambda: None) -> ServerSentEvent:
    """The SSE response of a stream whose first delta has arrived (so the engine accepted it); `on_close()`
    runs once the stream is done, finished or not (a thread's continuation releases its claim there)."""
    events = _events(start_message, first, deltas, final_usage, finish)

    async def close() -> None:
        try:
            await events.aclose()
        finally:
            on_close()

    return ServerSentEvent(events, background=BackgroundTask(close))

"""A job's result as a Response object, and its stream as the Responses API's events.

Output items: a `message` (one `output_text` part) when the turn has text, then
one `function_call` per tool call; ids are fixed when the response starts, so
the streamed items and the final object agree. Events, each with its
`sequence_number`:

    response.created - response.in_progress
    per item: response.output_item.added, then
        message:       response.content_part.added - response.output_text.delta ...
                       - response.output_text.done - response.content_part.done
        function_call: response.function_call_arguments.delta ... - response.function_call_arguments.done
    response.output_item.done
    response.completed (or response.incomplete when max_output_tokens cut it)

Text that is only whitespace is held until something else arrives, so a turn of
tool calls only has no message item, as in the non-streamed object.
"""

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing

from litestar.background_tasks import BackgroundTask
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage

from server.api_responses.schemas import NamedFunction, ResponsesRequest
from server.choice_stream import ChoiceDelta, ChoiceResult, Usage
from server.job import GenerationJob

logger = logging.getLogger("radixserve.server")


def usage_body(usage: Usage, job: GenerationJob) -> dict:
    num_written = max(0, min(job.num_breakpoint_tokens, usage.num_prompt_tokens) - usage.num_cached_tokens)
    return {"input_tokens": usage.num_prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.num_cached_tokens, "cache_write_tokens": num_written,
                                     "reused_document_tokens": usage.num_reused_document_tokens},  # extension
            "output_tokens": usage.num_completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.num_prompt_tokens + usage.num_completion_tokens}


def _function_call_item_id(call_id: str) -> str:
    return "fc_" + call_id.removeprefix("call_")


class ResponseShapes:
    def __init__(self, response_id: str, model: str, request: ResponsesRequest):
        self.id = response_id
        self.model = model
        self.request = request
        self.created_at = int(time.time())
        self.message_id = "msg_" + response_id.removeprefix("resp_")

    def _tool_choice(self):
        choice = self.request.tool_choice
        return {"type": "function", "name": choice.name} if isinstance(choice, NamedFunction) else (choice or "auto")

    def body(self, status: str, output: list[dict], usage: dict | None, extra: dict | None = None) -> dict:
        r = self.request
        fmt = r.text.format.model_dump(by_alias=True, exclude_none=True) if r.text and r.text.format else {"type": "text"}
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "completed_at": int(time.time()) if status != "in_progress" else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": r.instructions, "model": self.model, "output": output,
            "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id,
            "temperature": r.temperature, "top_p": r.top_p, "max_output_tokens": r.max_output_tokens,
            "tool_choice": self._tool_choice(),
            "tools": [t.model_dump() for t in r.tools or ()],
            "text": {"format": fmt}, "truncation": "disabled", "store": r.store is not False,
            "metadata": r.metadata or {}, "user": r.user,
            "prompt_cache_key": r.prompt_cache_key, "prompt_cache_retention": r.prompt_cache_retention,
            "usage": usage,
            **(extra or {}),
        }

    def message_item(self, text: str, status: str = "completed") -> dict:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
        return {"id": self.message_id, "type": "message", "status": status, "role": "assistant", "content": content}

    @staticmethod
    def call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
        return {"id": _function_call_item_id(call_id), "type": "function_call", "status": status,
                "call_id": call_id, "name": name, "arguments": arguments}

    def output(self, result: ChoiceResult) -> list[dict]:
        items = [self.message_item(result.text)] if result.content else []
        return items + [self.call_item(c.id, c.name, c.arguments) for c in result.tool_calls]

    def final(self, result: ChoiceResult, usage: Usage, job: GenerationJob, extra: dict | None) -> dict:
        status = "incomplete" if result.finish_reason == "length" else "completed"
        return self.body(status, self.output(result), usage_body(usage, job), extra)


def _event(body: dict) -> ServerSentEventMessage:
    return ServerSentEventMessage(data=json.dumps(body, ensure_ascii=False, separators=(",", ":")),
                                  event=body["type"], sep="\n")


class _Events:
    """The item-level events, numbered."""

    def __init__(self, shapes: ResponseShapes):
        self.shapes = shapes
        self.sequence_number = 0
        self.output: list[dict] = []  # finished items
        self.open: dict | None = None  # the item being streamed
        self.text = ""
        self.held = ""  # whitespace not yet given to the message

    def make(self, body: dict) -> dict:
        body = {**body, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        return body

    def _index(self) -> int:
        return len(self.output)

    def _close(self) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        events = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            item = self.shapes.message_item(self.text)
            common = {"item_id": item["id"], "output_index": self._index(), "content_index": 0}
            events += [self.make({"type": "response.output_text.done", **common, "text": self.text, "logprobs": []}),
                       self.make({"type": "response.content_part.done", **common, "part": part})]
        else:
            item = {**item, "status": "completed"}
            events.append(self.make({"type": "response.function_call_arguments.done", "item_id": item["id"],
                                     "output_index": self._index(), "name": item["name"],
                                     "arguments": item["arguments"]}))
        events.append(self.make({"type": "response.output_item.done", "output_index": self._index(), "item": item}))
        self.output.append(item)
        return events

    def text_delta(self, text: str, force: bool = False) -> list[dict]:
        events = []
        if self.open is None or self.open["type"] != "message":
            if not force and not (self.held + text).strip():
                self.held += text
                return []
            events += self._close()
            self.open, self.text = self.shapes.message_item("", "in_progress"), ""
            common = {"item_id": self.open["id"], "output_index": self._index()}
            events += [self.make({"type": "response.output_item.added", "output_index": self._index(),
                                  "item": self.open}),
                       self.make({"type": "response.content_part.added", **common, "content_index": 0,
                                  "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})]
            text, self.held = self.held + text, ""
        self.text += text
        return events + [self.make({"type": "response.output_text.delta", "item_id": self.open["id"],
                                    "output_index": self._index(), "content_index": 0, "delta": text,
                                    "logprobs": []})]

    def call_delta(self, call) -> list[dict]:
        events = []
        if call.id is not None:
            self.held = ""
            events += self._close()
            self.open = self.shapes.call_item(call.id, call.name, "", "in_progress")
            events.append(self.make({"type": "response.output_item.added", "output_index": self._index(),
                                     "item": dict(self.open)}))
        if call.arguments:
            self.open["arguments"] += call.arguments
            events.append(self.make({"type": "response.function_call_arguments.delta", "item_id": self.open["id"],
                                     "output_index": self._index(), "delta": call.arguments}))
        return events

    def finish(self, has_calls: bool) -> list[dict]:
        events = []
        if self.held and not has_calls and self.open is None:  # whitespace only: still the answer
            held, self.held = self.held, ""
            events += self.text_delta(held, force=True)
        return events + self._close()


async def _events(shapes: ResponseShapes, first: ChoiceDelta, deltas: AsyncIterator[ChoiceDelta],
                  finish: Callable[[ChoiceResult], Awaitable[dict]]) -> AsyncIterator[ServerSentEventMessage]:
    """`finish(result)` builds (and stores) the final object once the turn is done."""
    events = _Events(shapes)
    result = ChoiceResult(0)
    async with aclosing(deltas):
        try:
            created = shapes.body("in_progress", [], None)
            yield _event(events.make({"type": "response.created", "response": created}))
            yield _event(events.make({"type": "response.in_progress", "response": created}))
            delta = first
            while delta is not None:
                result.add(delta)
                for body in events.text_delta(delta.text) if delta.text else ():
                    yield _event(body)
                for call in delta.tool_calls:
                    for body in events.call_delta(call):
                        yield _event(body)
                if delta.finish_reason is not None:
                    for body in events.finish(bool(result.tool_calls)):
                        yield _event(body)
                    final = await finish(result)
                    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
                    yield _event(events.make({"type": kind, "response": final}))
                delta = await anext(deltas, None)
        except Exception:  # the status line went out long ago: report in-band
            logger.exception("stream %s failed", shapes.id)
            yield _event(events.make({"type": "error", "code": "server_error",
                                      "message": "internal server error while streaming", "param": None}))


def response_stream(shapes: ResponseShapes, first: ChoiceDelta, deltas: AsyncIterator[ChoiceDelta],
                    finish: Callable[[ChoiceResult], Awaitable[dict]]) -> ServerSentEvent:
    events = _events(shapes, first, deltas, finish)
    return ServerSentEvent(events, background=BackgroundTask(events.aclose))

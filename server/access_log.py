"""One structured (JSON) log line per HTTP request, written when the request is over.

The middleware wraps the whole application, so it sees every request: routed
or not, answered, failed, or cut off by the client. Handlers add what only
they know (the completion id, token counts, first-token time) to the request's
AccessRecord, found in the ASGI scope.
"""

import json
import logging
import time
from dataclasses import dataclass

from litestar import Request
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from server.completion_service import Usage
from server.disconnect import CLIENT_CLOSED_REQUEST, watch_body

logger = logging.getLogger("radixserve.access")

_SCOPE_KEY = "radixserve.access_record"


@dataclass
class AccessRecord:
    method: str
    path: str
    start_time: float  # time.perf_counter()
    status: int | None = None
    is_complete: bool = False  # the last body byte went out (False: client gone mid-request or mid-response)
    request_id: str | None = None
    usage: Usage | None = None

    def line(self, end_time: float) -> str:
        fields = {"id": self.request_id, "method": self.method, "route": self.path, "status": self.status,
                  "complete": self.is_complete}
        if self.usage is not None:
            usage = self.usage
            fields.update(prompt_tokens=usage.num_prompt_tokens, cached_tokens=usage.num_cached_tokens,
                          reused_document_tokens=usage.num_reused_document_tokens,
                          completion_tokens=usage.num_completion_tokens)
            if usage.first_token_time is not None:
                fields["ttft_ms"] = round((usage.first_token_time - self.start_time) * 1000, 1)
        fields["total_ms"] = round((end_time - self.start_time) * 1000, 1)
        return json.dumps(fields, separators=(",", ":"))


def access_record(request: Request) -> AccessRecord:
    """The request's record (a detached one when the app runs without the middleware)."""
    record = request.scope.get(_SCOPE_KEY)
    if record is None:
        record = request.scope[_SCOPE_KEY] = AccessRecord(request.method, request.url.path, time.perf_counter())
    return record


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = AccessRecord(scope["method"], scope["path"], time.perf_counter())
        scope[_SCOPE_KEY] = record

        async def send_and_watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                record.is_complete = record.status != CLIENT_CLOSED_REQUEST  # a 499 reaches no one
            await send(message)

        try:
            await self.app(scope, watch_body(scope, receive), send_and_watch)
        finally:
            logger.info(record.line(time.perf_counter()))

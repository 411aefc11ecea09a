"""Noticing a client that went away while its request is still being worked on.

Streams notice by themselves (Litestar's streaming response listens for
`http.disconnect` and cancels the stream). A handler that is still computing
its answer does not: uvicorn lets it run on. `until_disconnected` races the
work against the client's `http.disconnect` and cancels the work when the
client leaves first; cancelling closes the engine streams, which aborts them.
A client that leaves while still sending its body is noticed by `watch_body` (the
access log's middleware wraps every request's `receive` with it).
"""

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from litestar import Request
from litestar.types import Message, Receive, Scope

T = TypeVar("T")

# nginx's "client closed request": what the access log records for such a request.
CLIENT_CLOSED_REQUEST = 499

_BODY_CUT_KEY = "radixserve.body_cut"


def watch_body(scope: Scope, receive: Receive) -> Receive:
    """`receive`, noting in the scope a client that disconnects before its body is complete
    (Litestar then raises a 500 "client disconnected prematurely"; `is_body_cut` tells the
    error handler it was the client)."""
    is_body_complete = False

    async def receive_and_watch() -> Message:
        nonlocal is_body_complete
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            is_body_complete = True
        elif message["type"] == "http.disconnect" and not is_body_complete:
            scope[_BODY_CUT_KEY] = True
        return message

    return receive_and_watch


def is_body_cut(scope: Scope) -> bool:
    return bool(scope.get(_BODY_CUT_KEY))


class ClientDisconnected(Exception):
    """The client closed the connection before its answer was ready."""


async def _wait_for_disconnect(request: Request) -> None:
    # Called once the body is read: the next ASGI message is the disconnect
    # (or, if the response completes first, this task is cancelled).
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """The result of `work`, unless the client disconnects first: then `work` is
    cancelled and ClientDisconnected raised. Cancelling the caller cancels `work` too."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.create_task(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        if work_task.done():
            return work_task.result()
        raise ClientDisconnected
    finally:
        watch_task.cancel()
        work_task.cancel()

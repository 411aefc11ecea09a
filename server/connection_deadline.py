"""uvicorn's HTTP/1.1 protocol with a deadline for receiving each request.

uvicorn closes a keep-alive connection that stays idle after a response
(`timeout_keep_alive`), but it arms that timer only after a response, and any
byte cancels it: a connection that never sends a request, or sends half of its
headers or body and then nothing (slowloris), stays open for ever, and its
handler waits for ever on the body.

Here each connection must deliver a whole request, headers and body, within
`receive_timeout` seconds of opening or of its previous response; otherwise it
is closed (a handler waiting for the rest of the body sees a disconnect). The
deadline is lifted once the request is complete, so a long generation is never
cut by it.
"""

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class DeadlineH11Protocol(H11Protocol):
    receive_timeout: float = 30.0  # set by `with_receive_timeout`

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._arm_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._deadline is not None and self._request_is_received():
            self._cancel_deadline()

    def on_response_complete(self) -> None:
        self._arm_deadline()  # for the next request; a pipelined one may complete (and lift it) below
        super().on_response_complete()

    def _request_is_received(self) -> bool:
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and not cycle.more_body

    def _arm_deadline(self) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_later(self.receive_timeout, self._on_deadline)

    def _cancel_deadline(self) -> None:
        deadline = getattr(self, "_deadline", None)
        if deadline is not None:
            deadline.cancel()
            self._deadline = None

    def _on_deadline(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._request_is_received():
            return
        if self.conn.our_state is not h11.ERROR:
            try:
                self.conn.send(h11.ConnectionClosed())
            except h11.LocalProtocolError:
                pass
        self.transport.close()


def with_receive_timeout(seconds: float) -> type[DeadlineH11Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`, with this deadline."""
    return type("DeadlineH11Protocol", (DeadlineH11Protocol,), {"receive_timeout": seconds})

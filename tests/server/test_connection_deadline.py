"""Connections that never finish sending a request are closed after the receive timeout; a request
that did arrive whole is never cut by it, however long its answer takes."""

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from server.connection_deadline import with_receive_timeout

RECEIVE_TIMEOUT_S = 0.5


async def _app(scope, receive, send):
    """Reads the whole body (seeing a disconnect if it never comes), waits ?sleep seconds, answers."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            _app.disconnects += 1
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["query_string"] == b"sleep":
        await asyncio.sleep(RECEIVE_TIMEOUT_S * 3)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


_app.disconnects = 0


@pytest.fixture(scope="module")
def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(_app, host="127.0.0.1", port=port, log_level="warning", lifespan="off",
                            http=with_receive_timeout(RECEIVE_TIMEOUT_S))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=asyncio.run, args=(server.serve(),), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield port
    server.should_exit = True
    thread.join(timeout=10)


def _closed_by_server_after(port: int, data: bytes) -> float:
    """Send `data`, then wait for the server to close: seconds until it did (reading any answer)."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(10)
        started = time.monotonic()
        conn.sendall(data)
        while conn.recv(4096):
            pass
        return time.monotonic() - started


@pytest.mark.parametrize("data", [
    b"",  # connected, silent
    b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Le",  # half the headers
    b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"half\": ",  # half the body
], ids=["idle", "half-headers", "half-body"])
def test_a_half_sent_request_is_closed_after_the_timeout(port, data):
    disconnects = _app.disconnects
    assert RECEIVE_TIMEOUT_S * 0.9 <= _closed_by_server_after(port, data) < RECEIVE_TIMEOUT_S + 5
    if b"Content-Length" in data:  # the handler stops waiting for the body (in the server's thread)
        deadline = time.monotonic() + 5
        while _app.disconnects == disconnects and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _app.disconnects == disconnects + 1


def test_a_whole_request_gets_its_slow_answer_and_an_idle_keep_alive_connection_closes(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(10)
        conn.sendall(b"POST /echo?sleep HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok")
        answer = b""
        while not answer.endswith(b"ok"):
            chunk = conn.recv(4096)
            assert chunk, "closed before the answer"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert conn.recv(4096) == b""  # then silent: closed
        assert time.monotonic() - started < RECEIVE_TIMEOUT_S + 5

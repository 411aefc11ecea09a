"""A client's session key (`x-session-id` header) for routing affinity, read once per request.

An ASGI middleware around the ingress app puts the header into a context variable for the
request's task (and tasks it starts, which copy the context); ReplicaEngine.generate reads it
when the server passes no key of its own (`prompt_cache_key`).
"""

from contextvars import ContextVar

SESSION_HEADER = b"x-session-id"
MAX_KEY_LEN = 256

current_session_key: ContextVar[str | None] = ContextVar("radixserve_session_key", default=None)


class SessionKeyMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        key = None
        for name, value in scope.get("headers", ()):
            if name.lower() == SESSION_HEADER:
                key = value.decode("latin-1")[:MAX_KEY_LEN] or None
                break
        token = current_session_key.set(key)
        try:
            await self.app(scope, receive, send)
        finally:
            current_session_key.reset(token)

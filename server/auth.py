"""API-key guard of the /v1 routes (when the server has keys; /health and /metrics stay open), and who called.

A key comes as `Authorization: Bearer <key>` (OpenAI) or `x-api-key: <key>`
(Anthropic). The caller is named by a digest of its key, never the key itself:
stored responses, pins and turn memory are visible only to that caller (and
salt; turn memory also only to the same prompt_cache_key); with
`--tenant-per-key` the digest is also the cache salt of requests that name none,
so keys share no KV unless they name the same salt.
"""

import hashlib
import hmac
import json
from dataclasses import dataclass

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from server.errors import APIError


@dataclass(frozen=True)
class Caller:
    key_id: str  # sha256 of the key, 16 hex digits; "" on a server without keys
    salt_per_key: bool = False

    def cache_salt(self, requested: str | None) -> str | None:
        """The salt a request runs with: the one it names, else its key's (with --tenant-per-key)."""
        if requested is not None or not self.salt_per_key:
            return requested
        return f"key:{self.key_id}"

    def owner(self, cache_salt: str | None) -> str:
        """What stored state is scoped by: the key and the salt."""
        return f"{self.key_id}/{cache_salt or ''}"

    def turn_scope(self, cache_salt: str | None, prompt_cache_key: str | None) -> str:
        """Whose turn memory a prompt splices from and a finished turn goes into: the key, the salt and
        OpenAI's prompt_cache_key (as JSON, so no value can pass for another's)."""
        return json.dumps([self.key_id, cache_salt, prompt_cache_key])


def _presented_key(connection: ASGIConnection) -> str | None:
    scheme, _, token = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return connection.headers.get("x-api-key") or None


def _key_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def require_api_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    settings = connection.app.state.settings
    keys = settings.api_keys
    if not keys:
        connection.state.caller = Caller("")
        return
    presented = _presented_key(connection)
    # Compared with every key, so the time taken does not tell which one matched.
    matches = [presented is not None and hmac.compare_digest(presented.encode(), key.encode()) for key in keys]
    if not any(matches):
        raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                       code="invalid_api_key")
    connection.state.caller = Caller(_key_id(presented), salt_per_key=settings.tenant_per_key)


def caller_of(connection: ASGIConnection) -> Caller:
    return connection.state.caller

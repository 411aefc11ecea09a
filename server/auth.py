"""Bearer-key guard of the /v1 routes (when the server has a key; /health and /metrics stay open)."""

import hmac

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from server.errors import APIError


def require_api_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    api_key = connection.app.state.settings.api_key
    if api_key is None:
        return
    scheme, _, token = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                       code="invalid_api_key")

"""OpenAI error objects, and the exception handlers that turn every failure into one.

Every error response has the shape
    {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}
whether it came from our validation, the engine refusing a request, the chat
template, or the framework itself (unknown route, wrong method, body too large).
Bad input is always a 4xx; only a bug gives 500, logged with its traceback.
"""

import logging

from litestar import Request, Response
from litestar.exceptions import HTTPException
from pydantic import ValidationError

from assembly.chat_template import TemplateError
from engine.errors import RequestError
from server.disconnect import CLIENT_CLOSED_REQUEST, is_body_cut

logger = logging.getLogger("radixserve.server")

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"

_TYPE_BY_STATUS = {401: AUTHENTICATION, 404: NOT_FOUND}
_UNION_TAGS = {"str", "int", "float", "bool", "none"}


class APIError(Exception):
    """An error meant for the client, with its HTTP status."""

    def __init__(self, status_code: int, message: str, *, type: str | None = None, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type or (_TYPE_BY_STATUS.get(status_code) or
                             (SERVER_ERROR if status_code >= 500 else INVALID_REQUEST))
        self.param = param
        self.code = code
        self.headers = headers or {}


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _respond(error: APIError) -> Response:
    return Response(error_body(error.message, error.type, error.param, error.code),
                    status_code=error.status_code, headers=error.headers)


def param_path(loc: tuple) -> str | None:
    """pydantic's error location as a field path: ('messages', 0, 'role') -> 'messages[0].role'."""
    path = ""
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in _UNION_TAGS):
            continue  # pydantic names the union member it tried; not a field
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


def from_validation_error(error: ValidationError) -> APIError:
    first = error.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return invalid_request(f"malformed JSON body: {first['msg']}", code="invalid_json")
    param = param_path(first["loc"])
    message = first["msg"]
    if first["type"] == "finite_number":  # NaN, Infinity, or a literal that overflows to it
        message = "must be a finite number: NaN and Infinity (or a number that overflows to it) are refused"
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    where = f"{param}: " if param else "request body: "
    return invalid_request(where + message, param=param)


# ---- handlers -----------------------------------------------------------


def _api_error(_: Request, error: APIError) -> Response:
    return _respond(error)


def _validation_error(_: Request, error: ValidationError) -> Response:
    return _respond(from_validation_error(error))


# Fields the engine's RequestError messages start with ("top_p must be ...", "prompt (9001 tokens) + ...").
_ENGINE_PARAMS = {"max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                  "repetition_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "logit_bias", "seed",
                  "stop_token_ids", "logprobs", "prompt"}


def _request_error(_: Request, error: RequestError) -> Response:
    message = str(error)
    first_word = message.split(" ", 1)[0].split("[", 1)[0]
    return _respond(invalid_request(message, param=first_word if first_word in _ENGINE_PARAMS else None))


def _template_error(_: Request, error: TemplateError) -> Response:
    return _respond(invalid_request(f"messages cannot be rendered: {error}", param="messages"))


def _http_exception(request: Request, error: HTTPException) -> Response:
    """Framework errors: 404 unknown route, 405 wrong method, 413 body too large, ...; a client
    that went away while sending its body (Litestar's 500) is a client close: 499, no traceback."""
    status = error.status_code
    if is_body_cut(request.scope):
        logger.info("client closed %s %s while sending its body", request.method, request.url.path)
        return Response(b"", status_code=CLIENT_CLOSED_REQUEST)
    if status >= 500:
        return _internal_error(request, error)
    message = error.detail or "error"
    if status == 404:
        message = "no such route"
    elif status == 413:
        limit = getattr(request.app.state.get("settings"), "max_body_bytes", None)
        message = f"request body is larger than the {limit} bytes the server accepts (--max-body-bytes)"
    headers = {k: v for k, v in (error.headers or {}).items()}
    return _respond(APIError(status, message, headers=headers))


def _internal_error(request: Request, error: Exception) -> Response:
    logger.error("internal error in %s %s", request.method, request.url.path, exc_info=error)
    return _respond(APIError(500, "internal server error", type=SERVER_ERROR))


EXCEPTION_HANDLERS = {
    APIError: _api_error,
    ValidationError: _validation_error,
    RequestError: _request_error,
    TemplateError: _template_error,
    HTTPException: _http_exception,
    Exception: _internal_error,
}

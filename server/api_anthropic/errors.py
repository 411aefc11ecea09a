"""Anthropic's error shape for the Messages routes: `{"type": "error", "error": {"type", "message"}}`.

Every failure is first answered as the rest of the server answers it
(server/errors.py: validation, engine refusals, templates, the framework), then,
on a path under /v1/messages, re-shaped, with Anthropic's status codes: 529 for
an overloaded server; a message thread's error carries `details.error_code`
as Anthropic's does. By path, not by router: the framework's own errors (405
wrong method, 413 body too large) are raised before any route is chosen.
"""

from litestar import Request, Response

from server.errors import EXCEPTION_HANDLERS

_TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                   429: "rate_limit_error", 529: "overloaded_error"}
_STATUS = {503: 529}  # Anthropic's "overloaded"
ANTHROPIC_PATH_PREFIX = "/v1/messages"


def anthropic_error_body(status_code: int, message: str, code: str | None = None) -> dict:
    """`code`: a thread error's code ("thread_not_found"), which the SDK reads as `error.details.error_code`."""
    error_type = _TYPE_BY_STATUS.get(status_code, "api_error" if status_code >= 500 else "invalid_request_error")
    error = {"type": error_type, "message": message}
    if code is not None and code.startswith("thread_"):
        error["details"] = {"error_code": code}
    return {"type": "error", "error": error}


def _shaped_by_path(handler):
    def handle(request: Request, error: Exception) -> Response:
        response = handler(request, error)
        if not request.url.path.startswith(ANTHROPIC_PATH_PREFIX) or not isinstance(response.content, dict):
            return response  # not a Messages route, or no error body (499: the client left mid-body)
        status = _STATUS.get(response.status_code, response.status_code)
        error = response.content["error"]
        return Response(anthropic_error_body(status, error["message"], error.get("code")), status_code=status,
                        headers=response.headers)

    return handle


# The app's handlers: OpenAI's shape everywhere, Anthropic's on its routes.
EXCEPTION_HANDLERS_BY_API = {kind: _shaped_by_path(handler) for kind, handler in EXCEPTION_HANDLERS.items()}

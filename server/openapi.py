"""The OpenAPI document of the real routes: Litestar generates it; GET /openapi.json serves it
(as does Litestar's own /schema/openapi.json).

Handlers read their JSON body themselves (`Model.model_validate_json`, so every failure
is our 400 error object), which Litestar cannot see; each body route names its model with
`operation_class=json_body(Model)`, and the document then carries the model's JSON schema
(pydantic's, definitions inlined) as the route's request body.

`document_responses` then writes what every route can answer besides its 200: each
error status it can give, with the API's own error object (OpenAI's; Anthropic's on
/v1/messages), the streams' `text/event-stream`, and /metrics' Prometheus text. The
statuses follow from what a route is: every /v1 route may get 401 (with API keys);
a route with a body 400 (validation), 413 (--max-body-bytes) and 499 (the client left
while sending it, no body); one that names a model or a stored object 404; the
generating routes 503 when overloaded (Anthropic's 529); creating a collection or
adding documents 409. 422 is never answered: bad input is a 400, as OpenAI's.
"""

from typing import Any

from litestar import Request, get
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import OpenAPI, OpenAPIMediaType, OpenAPIResponse, Operation
from pydantic import BaseModel

LITESTAR_SCHEMA_PATH = "/schema"  # Litestar's routes: /schema, /schema/openapi.json


def openapi_config(version: str) -> OpenAPIConfig:
    return OpenAPIConfig(title="radixserve", version=version, path=LITESTAR_SCHEMA_PATH,
                         render_plugins=[JsonRenderPlugin()],
                         description="LLM server: OpenAI's chat completions, completions, responses and embeddings, "
                                     "Anthropic's messages, collections for retrieval.")


@get("/openapi.json", include_in_schema=False, sync_to_thread=False)
def openapi_document(request: Request) -> dict:
    return request.app.openapi_schema.to_schema()


def json_body(model: type[BaseModel]) -> type[Operation]:
    """An Operation class whose document names `model`'s JSON schema as the request body."""
    schema = _inline_definitions(model.model_json_schema(by_alias=True))

    class JSONBodyOperation(Operation):
        def to_schema(self) -> dict[str, Any]:
            result = super().to_schema()
            result["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
            return result

    JSONBodyOperation.__name__ = f"{model.__name__}Operation"
    return JSONBodyOperation


def _inline_definitions(schema: dict) -> dict:
    """pydantic's schema with every `{"$ref": "#/$defs/X"}` replaced by X (our models are not recursive)."""
    definitions = schema.pop("$defs", {})

    def inline(value: Any) -> Any:
        if isinstance(value, dict):
            ref = value.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(definitions[ref.removeprefix("#/$defs/")])
            return {key: inline(item) for key, item in value.items()}
        if isinstance(value, list):
            return [inline(item) for item in value]
        return value

    return inline(schema)


OPENAI_ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
ANTHROPIC_ERROR_SCHEMA = {
    "type": "object", "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"type": "string"}, "message": {"type": "string"},
                       "details": {"type": "object", "properties": {"error_code": {"type": "string"}}}}}}}

SSE_EVENT_SCHEMA = {  # one server-sent event; `data` is JSON text (or OpenAI's "[DONE]")
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}

_DESCRIPTIONS = {400: "invalid request", 401: "missing or wrong API key", 404: "no such model or object",
                 409: "conflicts with what exists (a collection of that name, another embedding model)",
                 413: "request too large (--max-body-bytes, or too many items)",
                 499: "the client closed the connection while sending the body (no body)",
                 503: "overloaded: retry after Retry-After", 529: "overloaded: retry after Retry-After"}
_GENERATING = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"}
_NAMING_A_MODEL = _GENERATING | {"/v1/embeddings", "/v1/messages/count_tokens"}
_CONFLICTING = {("post", "/v1/collections"), ("post", "/v1/collections/{name}/documents")}
_STREAMING = _GENERATING  # `stream: true` answers with server-sent events
_METRICS_PATH = "/metrics"
_CONSOLE_FILES_PATH = "/console/{name}"  # the web console's files (server/routes_console.py): a name it lacks is a 404


def _error_statuses(path: str, method: str, operation: Operation) -> list[int]:
    if path == _CONSOLE_FILES_PATH:
        return [404]
    if not path.startswith("/v1/"):
        return []
    statuses = {401}
    has_body = method in ("post", "put", "patch")
    if has_body:
        statuses |= {400, 413, 499}
    if operation.parameters:
        statuses |= {400, 404}  # a path names what may not exist; a query may not parse
    if path in _NAMING_A_MODEL:
        statuses.add(404)  # the model named
    if path in _GENERATING:
        statuses.add(529 if path.startswith("/v1/messages") else 503)
    if (method, path) in _CONFLICTING:
        statuses.add(409)
    if path in ("/v1/collections/{name}/documents", "/v1/embeddings"):
        statuses.add(413)  # too many documents or inputs in one request
    return sorted(statuses)


def _error_response(status: int, schema: dict) -> OpenAPIResponse:
    if status == 499:
        return OpenAPIResponse(description=_DESCRIPTIONS[status])
    return OpenAPIResponse(description=_DESCRIPTIONS[status],
                           content={"application/json": OpenAPIMediaType(schema=schema)})


def document_responses(document: OpenAPI) -> None:
    """Adds each route's error responses, the streams' and /metrics' media types (changes `document`)."""
    for path, item in (document.paths or {}).items():
        schema = ANTHROPIC_ERROR_SCHEMA if path.startswith("/v1/messages") else OPENAI_ERROR_SCHEMA
        for method in ("get", "post", "delete", "put", "patch"):
            operation = getattr(item, method, None)
            if operation is None:
                continue
            responses = {code: response for code, response in (operation.responses or {}).items()
                         if not code.startswith("4")}  # Litestar's own 400 is not the shape this server answers
            for status in _error_statuses(path, method, operation):
                responses[str(status)] = _error_response(status, schema)
            if path in _STREAMING and method == "post":
                responses["200"].content["text/event-stream"] = OpenAPIMediaType(schema=SSE_EVENT_SCHEMA)
            if path == _METRICS_PATH:
                responses["200"] = OpenAPIResponse(description="Prometheus text exposition format", content={
                    "text/plain": OpenAPIMediaType(schema={"type": "string"})})
            operation.responses = responses

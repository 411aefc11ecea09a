"""The OpenAPI document of the real routes: Litestar generates it; GET /openapi.json serves it
(as does Litestar's own /schema/openapi.json).

Handlers read their JSON body themselves (`Model.model_validate_json`, so every failure
is our 400 error object), which Litestar cannot see; each body route names its model with
`operation_class=json_body(Model)`, and the document then carries the model's JSON schema
(pydantic's, definitions inlined) as the route's request body.
"""

from typing import Any

from litestar import Request, get
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Operation
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

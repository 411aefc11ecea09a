"""GET /v1/models, /v1/models/{model}, /health, /metrics"""

from litestar import Response, get
from litestar.datastructures import State
from litestar.params import FromPath

from server.errors import APIError
from server.metrics import MEDIA_TYPE


def _generation_defaults(state: State) -> dict:
    """The defaults a request's left-out sampling fields take, and where each came from (flag, model, default)."""
    defaults = state.generation_defaults
    return {"generation_defaults": defaults.values.as_dict(), "generation_defaults_sources": defaults.sources}


def _model_card(state: State) -> dict:
    return {"id": state.settings.served_model_name, "object": "model", "created": state.started_at,
            "owned_by": "radixserve", "max_model_len": state.service.max_num_request_tokens,
            "backend": state.engine.facts.backend, **_generation_defaults(state)}


@get("/models")
async def list_models(state: State) -> dict:
    return {"object": "list", "data": [_model_card(state)]}


@get("/models/{model_id:path}")
async def get_model(state: State, model_id: FromPath[str]) -> dict:
    model_id = model_id.lstrip("/")
    if model_id != state.settings.served_model_name:
        raise APIError(404, f"model {model_id!r} does not exist", param="model", code="model_not_found")
    return _model_card(state)


@get("/health")
async def health(state: State) -> dict:
    """200 once the lifespan has loaded the model (before that the server does not accept connections);
    says which execution backend runs it, what runs there, and the sampling defaults in force."""
    facts = state.engine.facts
    return {"status": "ok", "backend": facts.backend, "backend_description": facts.backend_description,
            **_generation_defaults(state)}


@get("/metrics")
async def metrics(state: State) -> Response:
    return Response(state.metrics.render(), media_type=MEDIA_TYPE)  # Litestar adds the charset

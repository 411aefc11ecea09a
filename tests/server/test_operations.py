"""Operations, in-process: the OpenAPI document names every route, /metrics parses with
prometheus-client's own parser under a valid Content-Type, CORS preflights need no key,
embeddings of token ids and over-long inputs, stored metadata comes back exactly."""

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.retrieval_service import EMBEDDING_MODEL

KEY = "k-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _routes(app) -> set[tuple[str, str]]:
    """(path as OpenAPI writes it, method) of every route the app serves."""
    routes = set()
    for route in app.routes:
        for method in getattr(route, "methods", ()):
            if method in ("OPTIONS", "HEAD"):
                continue
            path = route.path_format
            routes.add((path, method.lower()))
    return routes


def test_openapi_document_names_every_route_with_its_body(make_client):
    client, _ = make_client(api_key=KEY)
    response = client.get("/openapi.json")  # no key: the document is public
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    published = {(path, method) for path, item in document["paths"].items() for method in item}
    served = {(path, method) for path, method in _routes(client.app)
              if path != "/openapi.json" and not path.startswith("/schema")}  # the document's own routes
    assert served and served <= published, served - published
    body = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert "messages" in body["schema"]["required"]
    assert "$ref" not in json.dumps(body)  # definitions inlined: the document stands alone
    assert client.get("/schema/openapi.json").json() == document
    for path in ("/v1/completions", "/v1/embeddings", "/v1/collections", "/v1/collections/{name}/search",
                 "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"):
        assert "requestBody" in document["paths"][path]["post"], path
    assert {"get", "delete"} <= set(document["paths"]["/v1/responses/{response_id}"])
    messages = document["paths"]["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"model", "messages", "max_tokens"} <= set(messages["required"]) and "$ref" not in json.dumps(messages)


def test_metrics_content_type_has_one_charset_and_the_body_parses(make_client):
    client, _ = make_client()
    client.post("/v1/completions", json={"prompt": "hi"})
    response = client.get("/metrics")
    content_type = response.headers.get_list("content-type")
    assert len(content_type) == 1
    params = [p.strip() for p in content_type[0].split(";")]
    assert params[0] == "text/plain" and sum(p.startswith("charset=") for p in params) == 1
    assert "charset=utf-8" in params and any(p.startswith("version=") for p in params)
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    assert "radixserve:time_to_first_token_seconds" in families
    assert families["radixserve:num_requests_running"].samples[0].value == 0


ORIGIN = "https://app.example.com"


def test_cors_preflight_needs_no_key_and_the_request_still_does(make_client):
    client, _ = make_client(api_key=KEY, allowed_origins=(ORIGIN,))
    preflight = client.options("/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
    assert preflight.status_code in (200, 204), preflight.text
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    without_key = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                              headers={"Origin": ORIGIN})
    assert without_key.status_code == 401
    with_key = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                           headers={"Origin": ORIGIN, **AUTH})
    assert with_key.status_code == 200 and with_key.headers["access-control-allow-origin"] == ORIGIN
    other = client.options("/v1/models", headers={"Origin": "https://evil.example",
                                                 "Access-Control-Request-Method": "GET"})
    assert other.headers.get("access-control-allow-origin") != "https://evil.example"


def test_no_cors_headers_without_allowed_origins(make_client):
    client, _ = make_client()
    response = client.get("/v1/models", headers={"Origin": ORIGIN})
    assert "access-control-allow-origin" not in response.headers


def test_allowed_origins_are_validated(smollm2_dir):
    from engine.engine_config import EngineConfig
    from server.settings import ServerSettings

    with pytest.raises(ValueError, match="origin"):
        ServerSettings(engine=EngineConfig(model_dir=smollm2_dir), served_model_name="m",
                       allowed_origins=("https://a.example/path",))


@pytest.fixture(scope="module")
def minilm_dir():
    from store.model_store import pull

    return pull(EMBEDDING_MODEL, progress=False)


@pytest.mark.model
def test_embeddings_of_token_ids_equal_those_of_the_text(make_client, minilm_dir):
    from tokenizers import Tokenizer

    client, _ = make_client()
    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()  # the file pads to 128
    ids = tokenizer.encode("hello world", add_special_tokens=False).ids
    by_text = client.post("/v1/embeddings", json={"input": "hello world"}).json()
    by_ids = client.post("/v1/embeddings", json={"input": ids}).json()
    several = client.post("/v1/embeddings", json={"input": [ids, ids[:1]]}).json()
    assert by_ids["usage"]["prompt_tokens"] == by_text["usage"]["prompt_tokens"] == len(ids) + 2
    assert by_ids["data"][0]["embedding"] == pytest.approx(by_text["data"][0]["embedding"], abs=1e-5)
    assert [d["index"] for d in several["data"]] == [0, 1]
    assert several["data"][0]["embedding"] == pytest.approx(by_ids["data"][0]["embedding"], abs=1e-5)
    out_of_vocab = client.post("/v1/embeddings", json={"input": [10**6]})
    assert out_of_vocab.status_code == 400 and out_of_vocab.json()["error"]["param"] == "input"


@pytest.mark.model
def test_an_embedding_input_over_the_window_is_a_400(make_client):
    client, _ = make_client()
    response = client.post("/v1/embeddings", json={"input": ["short", "word " * 300]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "input" and "input[1]" in error["message"] and "256" in error["message"]
    assert client.post("/v1/embeddings", json={"input": [[100] * 255]}).status_code == 400
    assert client.post("/v1/embeddings", json={"input": [[100] * 254]}).status_code == 200


EXACT_METADATA = {"big": 2**64 - 1, "small": -(2**63), "float": 0.1, "tiny": 5e-324, "huge": 1.7976931348623157e308,
                  "neg_zero": -0.0, "nested": {"list": [1, 2.5, {"deep": [None, True, "x"]}]}, "unicode": "é😀"}


@pytest.mark.model
def test_document_metadata_round_trips_exactly_or_is_refused(make_client):
    client, _ = make_client()
    assert client.post("/v1/collections", json={"name": "meta"}).status_code == 201
    sent = json.dumps({"documents": [{"id": "d", "text": "some text", "metadata": EXACT_METADATA}]})
    assert client.post("/v1/collections/meta/documents", content=sent,
                       headers={"Content-Type": "application/json"}).status_code == 200
    got = client.get("/v1/collections/meta/documents/d").json()["metadata"]
    assert json.dumps(got, sort_keys=True) == json.dumps(EXACT_METADATA, sort_keys=True)
    hit = client.post("/v1/collections/meta/search", json={"query": "text"}).json()["data"][0]
    assert json.dumps(hit["metadata"], sort_keys=True) == json.dumps(EXACT_METADATA, sort_keys=True)
    for value in (2**64, -(2**63) - 1, [1, [2**70]]):
        response = client.post("/v1/collections/meta/documents",
                               json={"documents": [{"text": "t", "metadata": {"x": value}}]})
        assert response.status_code == 400 and "integers" in response.json()["error"]["message"], response.text


def test_openapi_document_lists_each_routes_errors_in_its_apis_shape(make_client):
    client, _ = make_client()
    paths = client.get("/openapi.json").json()["paths"]
    chat = paths["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "400", "401", "404", "413", "499", "503"} <= set(chat)
    assert chat["400"]["content"]["application/json"]["schema"]["required"] == ["error"]
    assert "text/event-stream" in chat["200"]["content"] and "content" not in chat["499"]
    messages = paths["/v1/messages"]["post"]["responses"]
    assert {"400", "401", "404", "413", "499", "529"} <= set(messages) and "503" not in messages
    assert messages["400"]["content"]["application/json"]["schema"]["properties"]["type"] == {"const": "error"}
    assert set(paths["/v1/models"]["get"]["responses"]) == {"200", "401"}
    assert {"404", "401"} <= set(paths["/v1/responses/{response_id}"]["get"]["responses"])
    assert "409" in paths["/v1/collections"]["post"]["responses"]
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert set(paths["/health"]["get"]["responses"]) == {"200"}

"""The console's page and its API routes, in-process with the scripted fake engine: the page is
served from the package (and not with --no-ui), the routes need the key, a request's record is its
key's only, and its token breakdown is the engine's counts carried through."""

import pytest

from server.choice_stream import Usage
from server.request_records import RequestRecords, request_body
from server.routes_console import CONSOLE_DIR

KEY, OTHER_KEY = "console-key-1", "console-key-2"
PROMPT = [{"role": "user", "content": "hi"}]


def _bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_the_page_and_its_files_are_served_without_a_key_and_the_api_needs_one(make_client):
    client, _ = make_client(api_key=KEY)
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/console/app.js">' in page.text
    for name in sorted(path.name for path in CONSOLE_DIR.iterdir()):
        response = client.get(f"/console/{name}")
        assert response.status_code == 200, name
        assert response.content == (CONSOLE_DIR / name).read_bytes()
    script = client.get("/console/app.js")
    assert script.headers["content-type"].split(";")[0] == "text/javascript"
    unchanged = client.get("/console/app.js", headers={"If-None-Match": script.headers["etag"]})
    assert unchanged.status_code == 304 and unchanged.content == b""
    for name in ("%00", "..%2Froutes_console.py", "missing.js", "console.css%00.js"):
        response = client.get(f"/console/{name}")
        assert response.status_code == 404 and response.json()["error"]["message"], name
    for path in ("/v1/requests/chatcmpl-x", "/v1/cache"):
        response = client.get(path)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key", path


def test_no_ui_serves_no_page(make_client):
    client, _ = make_client(ui=False)
    assert client.get("/").status_code == 404
    assert client.get("/console/app.js").status_code == 404
    assert client.get("/v1/cache").status_code == 200  # the API stays


def test_page_names_no_third_party_host():
    """No CDN: every file the page loads comes from this server."""
    for path in CONSOLE_DIR.iterdir():
        text = path.read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, path.name


def test_a_request_record_is_its_keys_only_and_carries_the_engines_counts(make_client):
    client, engine = make_client(api_key=KEY, more_api_keys=(OTHER_KEY,))
    engine.num_cached_tokens, engine.num_reused_document_tokens = 5, 2
    response = client.post("/v1/chat/completions", headers=_bearer(KEY),
                           json={"messages": PROMPT, "stream": True, "stream_options": {"include_usage": True}})
    assert response.status_code == 200
    response_id = response.text.split('"id":"', 1)[1].split('"', 1)[0]
    body = client.get(f"/v1/requests/{response_id}", headers=_bearer(KEY)).json()
    sources = body["prompt_token_sources"]
    assert body["status"] == "completed" and body["object"] == "request"
    assert sum(sources.values()) == body["usage"]["prompt_tokens"] == len(engine.prompts[0])
    assert (sources["prefix_cache"], sources["document_store"], sources["disk_tier"]) == (3, 2, 0)
    assert body["usage"]["cached_tokens"] == 5 and body["usage"]["reused_document_tokens"] == 2
    assert body["timings"]["ttft_seconds"] > 0 and body["timings"]["tpot_seconds"] >= 0
    assert body["speculation"] == {"draft_tokens": 0, "accepted_tokens": 0, "acceptance_rate": None}

    other = client.get(f"/v1/requests/{response_id}", headers=_bearer(OTHER_KEY))
    assert other.status_code == 404 and other.json()["error"]["code"] == "request_not_found"
    assert client.get("/v1/requests/chatcmpl-nothing", headers=_bearer(KEY)).status_code == 404


def test_cache_route_reads_the_callers_tenant_only(make_client):
    """With --tenant-per-key each key's tenant is its own salt: the engine is asked for that salt's prefixes
    (engine/cached_prefixes.py walks only those: tests/engine/test_cached_prefixes.py)."""
    client, engine = make_client(api_key=KEY, more_api_keys=(OTHER_KEY,), tenant_per_key=True)
    mine = client.get("/v1/cache?limit=5", headers=_bearer(KEY)).json()
    client.get("/v1/cache", headers=_bearer(OTHER_KEY))
    (my_salt, limit), (their_salt, default_limit) = engine.prefix_reads
    assert my_salt.startswith("key:") and their_salt.startswith("key:") and my_salt != their_salt
    assert (limit, default_limit) == (5, 20)
    assert mine["pool"]["num_pages"] == 128 and mine["page_size"] == 16 and mine["read_at"] > 0
    assert mine["prefixes"] == [{"num_tokens": 32, "num_pages": 2, "num_derived_tokens": 0, "hit_count": 1,
                                 "num_ops_since_use": 3, "num_locking_requests": 0, "num_pinned_tokens": 16,
                                 "pin_seconds_left": 9.5, "head_text": mine["prefixes"][0]["head_text"],
                                 "tail_text": None}]
    for bad in ("0", "101", "x"):
        response = client.get(f"/v1/cache?limit={bad}", headers=_bearer(KEY))
        assert response.status_code == 400 and "error" in response.json(), bad


def test_cache_route_says_when_the_engine_cannot_show_its_tree(make_client):
    client, engine = make_client()
    engine.cached_prefixes_unavailable = "each replica has its own radix tree"  # as the replica router's handle
    response = client.get("/v1/cache")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["prefixes"] is None and "radix tree" in body["prefixes_unavailable"]
    assert body["pool"]["num_pages"] == 128


def test_records_are_bounded_oldest_out():
    records = RequestRecords(max_count=2)
    for i in range(3):
        records.record(f"r{i}", "k", Usage(), 1, False, 0.0)
    assert len(records) == 2 and records.lookup("r0", "k") is None and records.lookup("r2", "k") is not None
    with pytest.raises(ValueError):
        RequestRecords(max_count=0)


def test_a_running_request_reads_as_in_progress():
    records = RequestRecords()
    records.record("r", "", Usage(num_prompt_tokens=40, num_cached_tokens=32, num_disk_tier_tokens=16,
                                  num_recomputed_document_tokens=0), 1, False, 0.0)
    body = request_body(records.lookup("r", ""))
    assert body["status"] == "in_progress" and body["timings"] == {"ttft_seconds": None, "tpot_seconds": None}
    assert body["prompt_token_sources"] == {"prefix_cache": 16, "disk_tier": 16, "document_store": 0,
                                            "boundary_recompute": 0, "computed": 8}

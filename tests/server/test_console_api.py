"""The console's API routes on the shared real server (the default model, two keys): a request's token
breakdown equals the usage the API reported, another key cannot read it, the caller's tenant's cached
prefixes are listed. (Tenants per key: tests/server/test_console_routes.py and
tests/engine/test_cached_prefixes.py.)"""

import httpx
import pytest

from tests.server.conftest import API_KEY, OTHER_API_KEY

pytestmark = [pytest.mark.model]

SYSTEM = ("You are the console test's assistant. You answer in one short sentence. "
          "The secret word is marmalade, and you never say it.")


def _client(server, key: str) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def _chat(client: httpx.Client, messages: list[dict]) -> dict:
    response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 6, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()


def test_breakdown_equals_the_usage_and_stays_with_its_key(server):
    with _client(server, API_KEY) as mine, _client(server, OTHER_API_KEY) as theirs:
        first_turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello!"}]
        first = _chat(mine, first_turn)
        second_turn = first_turn + [first["choices"][0]["message"], {"role": "user", "content": "And now?"}]
        second = _chat(mine, second_turn)

        for answer in (first, second):
            body = mine.get(f"/v1/requests/{answer['id']}").json()
            usage, sources = answer["usage"], body["prompt_token_sources"]
            assert body["status"] == "completed"
            assert sum(sources.values()) == usage["prompt_tokens"] == body["usage"]["prompt_tokens"]
            assert (sources["prefix_cache"] + sources["disk_tier"] + sources["document_store"]
                    == usage["prompt_tokens_details"]["cached_tokens"])
            assert sources["document_store"] == usage["prompt_tokens_details"]["reused_document_tokens"]
            assert body["timings"]["ttft_seconds"] > 0
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the first turn's pages

        assert theirs.get(f"/v1/requests/{second['id']}").status_code == 404  # not the other key's to read
        cache = mine.get("/v1/cache?limit=100").json()
        assert any("marmalade" in p["head_text"] + (p["tail_text"] or "") for p in cache["prefixes"])
        assert cache["pool"]["num_pages"] > 0 and cache["disk_tier"]["max_bytes"] > 0


def test_console_routes_need_the_key(server):
    for path in ("/v1/cache", "/v1/requests/chatcmpl-anything"):
        response = httpx.get(server.base_url + path, timeout=10)
        assert response.status_code == 401, path
    assert httpx.get(server.base_url + "/", timeout=10).status_code == 200  # the page itself holds no data

"""OpenAI's prompt-cache controls on Chat Completions, and several API keys with a cache salt each."""

import uuid

import openai
import pytest

from tests.server.conftest import PAGE_SIZE, serving

pytestmark = [pytest.mark.model, pytest.mark.slow]

KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"


def _long_system() -> str:
    return f"Session {uuid.uuid4().hex}. " + " ".join(f"Rule {i}: answer briefly." for i in range(30))


def test_a_content_part_breakpoint_is_reused_and_diagnostics_compare_prompts(openai_client, server):
    system = [{"type": "text", "text": _long_system(), "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "30m"}}]
    first = openai_client.chat.completions.create(
        model=server.model, max_tokens=2, prompt_cache_key="tenant-docs", prompt_cache_retention="in_memory",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi"}])
    second = openai_client.chat.completions.create(
        model=server.model, max_tokens=2, prompt_cache_key="tenant-docs",
        prompt_cache_options={"mode": "explicit", "ttl": "30m", "comparison_response_id": first.id},
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hello"}])
    assert second.usage.prompt_tokens_details.cached_tokens >= PAGE_SIZE * 10
    diagnostics = second.model_dump()["prompt_cache_diagnostics"]
    assert diagnostics["type"] == "cache_miss" and diagnostics["reason"] == "input_changed"
    assert diagnostics["first_differing_block"] == "messages[1]"
    assert diagnostics["comparison_reusable_tokens"] >= second.usage.prompt_tokens_details.cached_tokens


@pytest.mark.parametrize("fields, fragment", [
    ({"prompt_cache_options": {"mode": "sometimes"}}, "mode"),
    ({"prompt_cache_options": {"ttl": "1h"}}, "ttl"),
    ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi",
                                                  "prompt_cache_breakpoint": {"mode": "implicit"}}]}]}, "mode"),
])
def test_bad_prompt_cache_fields_get_400(http, server, fields, fragment):
    body = {"model": server.model, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}], **fields}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def tenant_server(smollm2_dir, tmp_path_factory):
    server_dir = tmp_path_factory.mktemp("tenants")
    with serving(server_dir, ["--api-key", KEY_A, "--api-key", KEY_B, "--tenant-per-key"]) as running:
        yield running


def _cached(server, key: str, messages: list[dict], **fields) -> int:
    with openai.OpenAI(base_url=server.api_url, api_key=key, max_retries=0, timeout=120) as client:
        response = client.chat.completions.create(model=server.model, messages=messages, max_tokens=1, **fields)
    return response.usage.prompt_tokens_details.cached_tokens


def test_tenant_per_key_shares_kv_only_through_a_named_salt(tenant_server):
    messages = [{"role": "system", "content": _long_system()}, {"role": "user", "content": "Hi"}]
    assert _cached(tenant_server, KEY_A, messages) == 0
    assert _cached(tenant_server, KEY_A, messages) >= PAGE_SIZE * 10  # the key's own KV
    assert _cached(tenant_server, KEY_B, messages) == 0  # another key's is not visible
    shared = [{"role": "system", "content": _long_system()}, {"role": "user", "content": "Hi"}]
    assert _cached(tenant_server, KEY_A, shared, extra_body={"cache_salt": "team"}) == 0
    assert _cached(tenant_server, KEY_B, shared, extra_body={"cache_salt": "team"}) >= PAGE_SIZE * 10
    with openai.OpenAI(base_url=tenant_server.api_url, api_key=KEY_A, max_retries=0) as a, \
            openai.OpenAI(base_url=tenant_server.api_url, api_key=KEY_B, max_retries=0) as b:
        stored = a.responses.create(model=tenant_server.model, input="Hi", max_output_tokens=2)
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(stored.id)
        assert a.responses.retrieve(stored.id).id == stored.id

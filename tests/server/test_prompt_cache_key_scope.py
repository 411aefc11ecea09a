"""prompt_cache_key scopes turn memory (with the API key and salt) and reaches the engine as the affinity key."""

PROMPT = [{"role": "user", "content": "hi"}]


def _non_canonical_ids(tokenizer, text: str) -> list[int]:
    """`text` spelled one character per token: decodes to `text`, but tokenizing it again gives other ids,
    so only splicing puts these ids back into the next prompt."""
    ids = [token_id for char in text for token_id in tokenizer.encode(char)]
    assert tokenizer.decode(ids) == text and ids != tokenizer.encode(text)
    return ids


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i:i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_a_turn_remembered_under_one_prompt_cache_key_is_spliced_only_for_that_key(make_client, tokenizer):
    client, engine = make_client()
    engine.script = _non_canonical_ids(tokenizer, "Hello there")
    first = client.post("/v1/chat/completions", json={"messages": PROMPT, "prompt_cache_key": "a"})
    assert first.status_code == 200
    answer = first.json()["choices"][0]["message"]
    assert answer["content"] == "Hello there"
    history = PROMPT + [{"role": "assistant", "content": answer["content"]}, {"role": "user", "content": "and?"}]
    for key in ("a", "b", None):
        body = {"messages": history, **({"prompt_cache_key": key} if key is not None else {})}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    spliced_a, unspliced_b, unspliced_none = engine.prompts[1:]
    # Key "a": the next prompt starts with the first prompt and exactly the ids generated for it.
    assert spliced_a[:len(engine.prompts[0]) + len(engine.script)] == engine.prompts[0] + engine.script
    # Another key, or none: the turn is tokenized again from its text.
    assert not _contains(unspliced_b, engine.script) and unspliced_b == unspliced_none
    assert engine.affinity_keys == ["a", "a", "b", None]


def test_a_turn_is_not_spliced_for_another_api_key_with_the_same_prompt_cache_key(make_client, tokenizer):
    client, engine = make_client(api_key="key-one", more_api_keys=("key-two",))
    engine.script = _non_canonical_ids(tokenizer, "Hello there")

    def chat(key: str, messages: list[dict]):
        response = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                               json={"messages": messages, "prompt_cache_key": "shared"})
        assert response.status_code == 200
        return response.json()

    content = chat("key-one", PROMPT)["choices"][0]["message"]["content"]
    history = PROMPT + [{"role": "assistant", "content": content}, {"role": "user", "content": "and?"}]
    chat("key-two", history)
    chat("key-one", history)
    assert not _contains(engine.prompts[1], engine.script) and _contains(engine.prompts[2], engine.script)


def test_responses_pass_prompt_cache_key_as_the_affinity_key(make_client):
    client, engine = make_client()
    response = client.post("/v1/responses", json={"input": "hi", "prompt_cache_key": "session-7"})
    assert response.status_code == 200
    assert engine.affinity_keys == ["session-7"]

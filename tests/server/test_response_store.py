"""The stored-Responses file: owners, bounds (count, bytes, age), restarts."""

from server.response_store import ResponseStore


def _put(store, response_id: str, owner: str = "key/", now: float = 1000.0, text: str = "hi") -> None:
    store.put(owner, {"id": response_id, "text": text}, [{"role": "user", "content": text}],
              [{"content": text, "calls": [], "token_ids": [1, 2, 3]}], [7, 8, 9], now=now)


def test_a_response_is_visible_only_to_its_owner_and_survives_a_restart(tmp_path):
    store = ResponseStore(tmp_path / "r.sqlite3", max_count=10, max_bytes=1 << 20, max_age_seconds=100)
    _put(store, "resp_1", owner="a/")
    assert store.get("resp_1", "b/", now=1001) is None and not store.delete("resp_1", "b/")
    store.close()
    reopened = ResponseStore(tmp_path / "r.sqlite3", max_count=10, max_bytes=1 << 20, max_age_seconds=100)
    stored = reopened.get("resp_1", "a/", now=1001)
    assert stored.body == {"id": "resp_1", "text": "hi"} and stored.turns[0]["token_ids"] == [1, 2, 3]
    assert stored.prompt_ids.tolist() == [7, 8, 9] and stored.messages == [{"role": "user", "content": "hi"}]
    assert reopened.delete("resp_1", "a/") and reopened.get("resp_1", "a/", now=1001) is None
    reopened.close()


def test_bounds_drop_the_oldest_first(tmp_path):
    store = ResponseStore(tmp_path / "r.sqlite3", max_count=3, max_bytes=1 << 20, max_age_seconds=100)
    for i in range(5):
        _put(store, f"resp_{i}", now=1000.0 + i)
    assert len(store) == 3 and store.get("resp_1", "key/", now=1005) is None
    assert store.get("resp_4", "key/", now=1005) is not None
    assert store.get("resp_4", "key/", now=1200) is None  # past its age, even before the next write
    _put(store, "resp_5", now=1200)
    assert len(store) == 1  # the write dropped everything past its age
    store.close()


def test_the_byte_bound(tmp_path):
    store = ResponseStore(tmp_path / "r.sqlite3", max_count=100, max_bytes=2000, max_age_seconds=100)
    for i in range(10):
        _put(store, f"resp_{i}", now=1000.0 + i, text="x" * 300)
    kept = [i for i in range(10) if store.get(f"resp_{i}", "key/", now=1010) is not None]
    assert kept == list(range(10 - len(kept), 10)) and 0 < len(kept) < 10
    store.close()

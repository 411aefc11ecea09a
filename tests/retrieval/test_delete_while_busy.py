"""Deleting a collection while other threads write to and search it: each of their calls
either succeeds or says the collection does not exist (never another error), and every
write that returned was in the store when the delete closed it."""

import threading

from retrieval import indexed_collection as collection_module
from retrieval.collections import Collections, NewDocument
from retrieval.errors import CollectionNotFoundError

NUM_ROUNDS = 6
NUM_WRITERS = 3


def test_delete_under_concurrent_writes_and_searches(tmp_path, fake_embedder, monkeypatch):
    collections = Collections(tmp_path / "collections", lambda: fake_embedder)
    ids_at_close: list[set[str]] = []
    real_close = collection_module.IndexedCollection.close

    def close_and_record(self):
        with self._lock:  # what the store holds at the moment of closing
            if not self._is_closed:
                rows = self._store._db.execute("SELECT id FROM documents").fetchall()
                ids_at_close.append({r[0] for r in rows})
            real_close(self)

    monkeypatch.setattr(collection_module.IndexedCollection, "close", close_and_record)
    unexpected: list[BaseException] = []
    for round_index in range(NUM_ROUNDS):
        collections.create("busy")
        acknowledged: list[str] = []
        stop = threading.Event()

        def write(writer: int) -> None:
            i = 0
            while not stop.is_set():
                try:
                    acknowledged.extend(collections.add_documents(
                        "busy", [NewDocument(f"document {writer} {i} about tea and cats", f"w{writer}-{i}")]))
                except CollectionNotFoundError:
                    return
                except BaseException as error:  # noqa: BLE001 - the test reports it
                    unexpected.append(error)
                    return
                i += 1

        def search() -> None:
            while not stop.is_set():
                try:
                    collections.search("busy", "tea", top_k=3)
                    collections.info("busy")
                except CollectionNotFoundError:
                    return
                except BaseException as error:  # noqa: BLE001
                    unexpected.append(error)
                    return

        threads = [threading.Thread(target=write, args=(w,)) for w in range(NUM_WRITERS)]
        threads.append(threading.Thread(target=search))
        for thread in threads:
            thread.start()
        while len(acknowledged) < 5 * (round_index + 1):
            threading.Event().wait(0.001)
        ids_at_close.clear()
        collections.delete("busy")
        stop.set()
        for thread in threads:
            thread.join()
        assert not unexpected, unexpected
        assert len(ids_at_close) == 1
        assert set(acknowledged) <= ids_at_close[0]  # no acknowledged write was lost before the delete
    collections.close()

"""Stored Responses (`store: true`) in SQLite: what GET returns, and what `previous_response_id` continues.

A stored response keeps its body, the conversation it ended (messages in
OpenAI's shape, its own output turn last, instructions aside: they are not
carried over, as OpenAI's), the generated token ids of every assistant turn of
that conversation (so a continuation splices them back and starts with exactly
the earlier prompt + output, whatever turn memory has forgotten since), and its
prompt's token ids (for cache diagnostics).

Anthropic's message threads are kept the same way, in their own table (server/api_anthropic/threads.py):
a reply's conversation, system turn included, the thread's tools and system/tool breakpoints, and which
reply continued it (a reply is continued once, in the same transaction that stores its continuation).

Visible only to its owner (the API key's digest and the cache salt): another
caller gets "not found", as for an id that never existed. Bounded by count,
bytes and age; the oldest go first. WAL, one transaction per write: a response
the API returned survives a restart. Calls are short and run on a worker thread.
"""

import json
import sqlite3
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from server.choice_stream import ChoiceResult

_SCHEMA = """
CREATE TABLE IF NOT EXISTS {table} (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    num_bytes INTEGER NOT NULL,
    body TEXT NOT NULL,         -- the response object, JSON
    conversation TEXT NOT NULL, -- {{"messages": [...], "turns": [{{"content", "calls", "token_ids"}}], "tools": [...]}}
    prompt_ids BLOB NOT NULL    -- uint32 token ids
);
CREATE INDEX IF NOT EXISTS {table}_by_age ON {table} (created_at);
CREATE TABLE IF NOT EXISTS {table}_continued (
    id TEXT PRIMARY KEY,        -- a stored reply that a message thread continued (once: Anthropic's rule)
    continued_by TEXT NOT NULL  -- the reply that continued it
);
"""


@dataclass(frozen=True)
class StoredResponse:
    id: str
    body: dict
    messages: list[dict]
    turns: list[dict]  # {"content": str | None, "calls": [[id, name, arguments]], "token_ids": [int]}
    prompt_ids: array
    tools: list[dict] = field(default_factory=list)  # a message thread's tools, OpenAI's function shape
    breakpoints: list[list] = field(default_factory=list)  # a message thread's [message_index, seconds, content]
    continued_by: str | None = None  # a message thread's reply: the id of the reply that continued it, if one did


def conversation_turn(result: ChoiceResult) -> tuple[dict, dict]:
    """A finished turn as the assistant message the conversation ends with and its stored turn (generated ids)."""
    message = {"role": "assistant", "content": result.content}
    if result.tool_calls:
        message["tool_calls"] = [call.to_openai() for call in result.tool_calls]
    # A turn that ended on its stop token: the template writes that token itself.
    token_ids = result.token_ids if result.finish_reason == "length" else result.token_ids[:-1]
    turn = {"content": result.content, "calls": [[c.id, c.name, c.arguments] for c in result.tool_calls],
            "token_ids": token_ids}
    return message, turn


class ResponseStore:
    def __init__(self, path: Path, max_count: int, max_bytes: int, max_age_seconds: float, table: str = "responses"):
        """`table`: "responses", or "message_threads" (Anthropic's threads, in the same file, bounded apart)."""
        self.path = Path(path)
        self.table = table
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.max_age_seconds = max_age_seconds
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None  # opened on first use: a server that stores nothing writes nothing

    @property
    def _db(self) -> sqlite3.Connection:
        """Call with the lock held."""
        if self._connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            connection.executescript(_SCHEMA.format(table=self.table))
            self._connection = connection
        return self._connection

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def put(self, owner: str, body: dict, messages: list[dict], turns: list[dict], prompt_ids: list[int],
            now: float | None = None, tools: list[dict] | None = None, breakpoints: list[list] | None = None,
            continues: str | None = None) -> None:
        """`continues`: the stored reply this one continues (a message thread's), marked continued in the same
        transaction."""
        now = time.time() if now is None else now
        body_text = json.dumps(body, ensure_ascii=False)
        thread = {"tools": tools or [], "breakpoints": breakpoints or []} if tools or breakpoints else {}
        conversation = json.dumps({"messages": messages, "turns": turns, **thread}, ensure_ascii=False)
        ids = array("I", prompt_ids).tobytes()
        num_bytes = len(body_text.encode()) + len(conversation.encode()) + len(ids)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(f"INSERT OR REPLACE INTO {self.table} VALUES (?, ?, ?, ?, ?, ?, ?)",
                                 (body["id"], owner, now, num_bytes, body_text, conversation, ids))
                if continues is not None:
                    self._db.execute(f"INSERT OR REPLACE INTO {self.table}_continued VALUES (?, ?)",
                                     (continues, body["id"]))
                self._evict(now)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _evict(self, now: float) -> None:
        self._db.execute(f"DELETE FROM {self.table} WHERE created_at < ?", (now - self.max_age_seconds,))
        count, num_bytes = self._db.execute(f"SELECT COUNT(*), COALESCE(SUM(num_bytes), 0) FROM {self.table}").fetchone()
        rows = self._db.execute(f"SELECT id, num_bytes FROM {self.table} ORDER BY created_at")
        doomed = []
        for response_id, size in rows:
            if count <= self.max_count and num_bytes <= self.max_bytes:
                break
            doomed.append((response_id,))
            count, num_bytes = count - 1, num_bytes - size
        self._db.executemany(f"DELETE FROM {self.table} WHERE id = ?", doomed)
        self._db.execute(f"DELETE FROM {self.table}_continued WHERE id NOT IN (SELECT id FROM {self.table})")

    def get(self, response_id: str, owner: str, now: float | None = None) -> StoredResponse | None:
        now = time.time() if now is None else now
        with self._lock:
            row = self._db.execute(f"SELECT body, conversation, prompt_ids, continued_by FROM {self.table} "
                                   f"LEFT JOIN {self.table}_continued USING (id) "
                                   "WHERE id = ? AND owner = ? AND created_at >= ?",
                                   (response_id, owner, now - self.max_age_seconds)).fetchone()
        if row is None:
            return None
        conversation = json.loads(row[1])
        prompt_ids = array("I")
        prompt_ids.frombytes(row[2])
        return StoredResponse(response_id, json.loads(row[0]), conversation["messages"], conversation["turns"],
                              prompt_ids, conversation.get("tools", []), conversation.get("breakpoints", []), row[3])

    def delete(self, response_id: str, owner: str) -> bool:
        with self._lock:
            cursor = self._db.execute(f"DELETE FROM {self.table} WHERE id = ? AND owner = ?", (response_id, owner))
        return cursor.rowcount > 0

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute(f"SELECT COUNT(*) FROM {self.table}").fetchone()[0]

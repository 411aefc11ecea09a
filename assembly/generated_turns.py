"""The token ids the model generated for recent assistant turns, found again when a client sends them back.

A multi-turn client sends the assistant's last answer back as history. Rendered
by the template and tokenized again, its text may come out as other tokens than
the ones generated (a model is free to sample a non-canonical tokenization, and
a tool call's JSON may be re-serialised), and every token after the first
difference misses the prefix cache. Splicing the generated ids in instead makes
the next prompt start with exactly the sequence the engine cached.

Kept apart per scope (the server's: API key, cache salt and prompt_cache_key),
so a turn remembered in one scope is never spliced into another's prompt. Within
a scope, keyed by what the client sends back: the content (None and "" alike) and each
tool call's id, name and arguments (compared as parsed JSON, so re-serialised
arguments still match). Tool-call ids are unique per response, so a tool turn
is found only by the client that received it; text turns are matched by their
text, and equal texts share an entry (either entry's ids spell the same text).
Bounded by the tokens it holds (4 bytes each), least recently used first out.
Thread-safe (prompts are built in worker threads, turns remembered on the event loop).
"""

import hashlib
import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from assembly.tool_calls import ToolCall

DEFAULT_MAX_TOKENS = 4 << 20  # 16 MiB of token ids


def _canonical_arguments(arguments) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _key(scope: str, content: str | None, calls: Sequence[tuple[str, str, str]]) -> bytes:
    payload = json.dumps([scope, content or "", [[i, n, _canonical_arguments(a)] for i, n, a in calls]],
                         ensure_ascii=False)
    return hashlib.sha256(payload.encode()).digest()


def message_key(message: dict, scope: str = "") -> bytes | None:
    """The key of an assistant message in OpenAI's shape in `scope`, or None if its calls are malformed."""
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return None
        calls.append((call.get("id"), function.get("name"), function.get("arguments")))
    return _key(scope, message.get("content"), calls)


class GeneratedTurns:
    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS):
        self.max_tokens = max_tokens
        self._turns: OrderedDict[bytes, array] = OrderedDict()
        self.num_tokens = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._turns)

    def remember(self, content: str | None, calls: Sequence[ToolCall], token_ids: Sequence[int],
                 scope: str = "") -> None:
        """`token_ids`: what the model generated for this turn, without the end-of-turn token
        (the template writes that itself); only a lookup in the same `scope` finds it."""
        key = _key(scope, content, [(c.id, c.name, c.arguments) for c in calls])
        ids = array("I", token_ids)
        with self._lock:
            if key in self._turns:
                self.num_tokens -= len(self._turns.pop(key))
            self._turns[key] = ids
            self.num_tokens += len(ids)
            while self.num_tokens > self.max_tokens and self._turns:
                self.num_tokens -= len(self._turns.popitem(last=False)[1])

    def lookup(self, message: dict, scope: str = "") -> list[int] | None:
        key = message_key(message, scope)
        if key is None:
            return None
        with self._lock:
            ids = self._turns.get(key)
            if ids is None:
                return None
            self._turns.move_to_end(key)
            return ids.tolist()

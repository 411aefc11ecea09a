"""Anthropic's message threads: the server holds a conversation, so each later turn sends only what is new.

The anthropic SDK's agent loop (`client.beta.messages.tool_runner`, Node's
`toolRunner`, `client.beta.messages.thread()`) sends `thread: {"type": "create"}`
with the whole conversation, then `{"type": "continue", "previous_message_id":
<the last reply's id>}` with only the new messages, and neither `system` nor
`tools` (the thread keeps those it was created with; a `continue` that sends them
is a 400). Every reply of a thread is stored under its id, as a stored Response is
(server/response_store.py, table "message_threads"; same owner scoping: the API
key and the cache salt, another caller's id is "not found"): the conversation in
OpenAI's shape with the reply last, the thread's tools and system/tool
breakpoints, and the generated token ids of every assistant turn. A `continue`
puts those ids back into turn memory first, so its prompt starts with exactly the
tokens the engine computed and cached for the earlier turns.

A `continue` whose id is unknown, expired or another caller's is a 404 whose
`error.details.error_code` is "thread_not_found". As Anthropic's API, a reply is
continued once: a second `continue` from it (a fork) is a 400 "thread_already_continued",
and one sent while another continuation of it is still running a 400
"thread_continue_in_flight". On any of the three the SDK replays the whole history
under a new thread (whose prompt the prefix cache still holds). A continuation that
fails before its reply is stored (an error, a client that leaves) leaves the reply
free to be continued again.
"""

import asyncio
from collections.abc import Callable

from assembly.generated_turns import GeneratedTurns
from server.api_anthropic.schemas import MessagesRequest
from server.api_anthropic.translation import TranslatedPrompt
from server.api_responses.translation import remember_stored_turns
from server.choice_stream import ChoiceResult
from server.errors import APIError
from server.response_store import ResponseStore, StoredResponse, conversation_turn

THREADS_TABLE = "message_threads"
THREAD_NOT_FOUND = "thread_not_found"
THREAD_ALREADY_CONTINUED = "thread_already_continued"
THREAD_CONTINUE_IN_FLIGHT = "thread_continue_in_flight"


class ThreadContinuations:
    """The stored replies being continued right now, by (owner, message id): one continuation at a time each.
    Claimed and released on the server's event loop (no lock)."""

    def __init__(self):
        self._in_flight: set[tuple[str, str]] = set()

    def claim(self, owner: str, message_id: str) -> Callable[[], None]:
        """Claims the reply (400 thread_continue_in_flight when it is claimed already); returns its release,
        which may be called more than once."""
        key = (owner, message_id)
        if key in self._in_flight:
            raise APIError(400, f"thread: message {message_id!r} is being continued by another request; continue "
                                "from that request's reply", param="thread.previous_message_id",
                           code=THREAD_CONTINUE_IN_FLIGHT)
        self._in_flight.add(key)
        return lambda: self._in_flight.discard(key)


async def thread_to_continue(store: ResponseStore, continuations: ThreadContinuations, request: MessagesRequest,
                             owner: str, turns: GeneratedTurns | None, turn_scope: str
                             ) -> tuple[StoredResponse | None, Callable[[], None]]:
    """The stored thread a `continue` carries on, its turns back in turn memory, and the release of its claim
    (the caller releases it once the continuation's reply is stored or has failed); (None, a no-op) for any
    other request."""
    if not request.continues_thread:
        return None, lambda: None
    message_id = request.thread.previous_message_id
    release = continuations.claim(owner, message_id)  # before reading: a continuation stored meanwhile is seen
    try:
        stored = await asyncio.to_thread(store.get, message_id, owner)
        if stored is None:
            raise APIError(404, f"thread: no message {message_id!r} to continue (unknown, expired, or not visible "
                                "to this key)", param="thread.previous_message_id", code=THREAD_NOT_FOUND)
        if stored.continued_by is not None:
            raise APIError(400, f"thread: message {message_id!r} was continued already (by {stored.continued_by!r}); "
                                "a reply is continued once: continue from the thread's latest reply",
                           param="thread.previous_message_id", code=THREAD_ALREADY_CONTINUED)
    except BaseException:
        release()
        raise
    remember_stored_turns(turns, stored, turn_scope)
    return stored, release


def store_thread_turn(store: ResponseStore, owner: str, body: dict, prompt: TranslatedPrompt,
                      previous: StoredResponse | None, result: ChoiceResult, prompt_ids: list[int]) -> None:
    """The thread up to this reply, under the reply's id (a worker thread's call: SQLite)."""
    output_message, turn = conversation_turn(result)
    turns = (previous.turns if previous is not None else []) + [turn]
    breakpoints = [[b.message_index, b.seconds, b.content] for b in prompt.breakpoints[:prompt.num_thread_breakpoints]]
    store.put(owner, body, prompt.messages + [output_message], turns, prompt_ids, tools=prompt.tools,
              breakpoints=breakpoints, continues=previous.id if previous is not None else None)

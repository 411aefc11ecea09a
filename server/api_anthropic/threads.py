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
`error.details.error_code` is "thread_not_found": the SDK then replays the whole
history under a new thread. A reply may be continued more than once (each
continuation forks from it); Anthropic's "thread_already_continued" is not raised.
"""

import asyncio

from assembly.generated_turns import GeneratedTurns
from server.api_anthropic.schemas import MessagesRequest
from server.api_anthropic.translation import TranslatedPrompt
from server.api_responses.translation import remember_stored_turns
from server.choice_stream import ChoiceResult
from server.errors import APIError
from server.response_store import ResponseStore, StoredResponse, conversation_turn

THREADS_TABLE = "message_threads"
THREAD_NOT_FOUND = "thread_not_found"


async def thread_to_continue(store: ResponseStore, request: MessagesRequest, owner: str, turns: GeneratedTurns | None,
                             turn_scope: str) -> StoredResponse | None:
    """The stored thread a `continue` carries on, its turns back in turn memory; None for any other request."""
    if not request.continues_thread:
        return None
    message_id = request.thread.previous_message_id
    stored = await asyncio.to_thread(store.get, message_id, owner)
    if stored is None:
        raise APIError(404, f"thread: no message {message_id!r} to continue (unknown, expired, or not visible "
                            "to this key)", param="thread.previous_message_id", code=THREAD_NOT_FOUND)
    remember_stored_turns(turns, stored, turn_scope)
    return stored


def store_thread_turn(store: ResponseStore, owner: str, body: dict, prompt: TranslatedPrompt,
                      previous: StoredResponse | None, result: ChoiceResult, prompt_ids: list[int]) -> None:
    """The thread up to this reply, under the reply's id (a worker thread's call: SQLite)."""
    output_message, turn = conversation_turn(result)
    turns = (previous.turns if previous is not None else []) + [turn]
    breakpoints = [[b.message_index, b.seconds, b.content] for b in prompt.breakpoints[:prompt.num_thread_breakpoints]]
    store.put(owner, body, prompt.messages + [output_message], turns, prompt_ids, tools=prompt.tools,
              breakpoints=breakpoints)

"""Tool turns that answer no call, and calls left unanswered: found before a prompt is built.

Every API that takes turns refuses these with a 400, as OpenAI and Anthropic do
(without the check, a tool turn with no call id renders as a plain turn and the
model may write until the context ends). Over messages in OpenAI's shape: a run
of tool turns answers the tool calls of the assistant turn right before it; a tool
turn needs a `tool_call_id`, and one of that assistant turn's; once another turn
follows, every call must have had its answer. An assistant turn whose calls end the
conversation is left alone (the caller has not run them yet). Each API words the
problem as its own API does (server/api_anthropic/, server/api_responses/,
server/chat_translation.py).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ProblemKind = Literal["missing_call_id", "no_call_before", "unknown_call_id", "unanswered_calls"]


@dataclass(frozen=True)
class ToolTurnProblem:
    kind: ProblemKind
    message_index: int  # the tool turn, or for "unanswered_calls" the assistant turn whose calls were not answered
    call_ids: tuple[str, ...] = ()  # the tool turn's id, or the unanswered ones


def find_tool_turn_problem(messages: Sequence[dict]) -> ToolTurnProblem | None:
    """The first problem in `messages` (OpenAI's shape), or None."""
    open_index: int | None = None  # the assistant turn whose calls the current run of tool turns answers
    open_ids: list[str] = []
    unanswered: list[str] = []
    for index, message in enumerate(messages):
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if not call_id:
                return ToolTurnProblem("missing_call_id", index)
            if open_index is None:
                return ToolTurnProblem("no_call_before", index, (call_id,))
            if call_id not in open_ids:
                return ToolTurnProblem("unknown_call_id", index, (call_id,))
            if call_id in unanswered:
                unanswered.remove(call_id)
            continue
        if unanswered:
            return ToolTurnProblem("unanswered_calls", open_index, tuple(unanswered))
        calls = message.get("tool_calls") or () if message.get("role") == "assistant" else ()
        open_ids = [call["id"] for call in calls]
        open_index = index if open_ids else None
        unanswered = list(open_ids)
    return None

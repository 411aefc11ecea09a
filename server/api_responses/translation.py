"""OpenAI Responses -> the internal job: input items (and a stored response continued) as a ChatJob.

Items become messages in OpenAI's chat shape: a message item its role's turn
(`developer` -> system), `function_call` items the tool calls of the assistant
turn they follow (or of a new one), `function_call_output` items tool turns.
An output with no call before it, or a call left without its output, is a 400
(server/tool_turns.py). `instructions` is the system turn in front; it is not carried over by
`previous_response_id` (as OpenAI's), which continues the stored conversation:
its messages, then this input. The stored turns' generated ids go back into
turn memory first, so the prompt starts with exactly the stored prompt + output.
"""

import uuid
from dataclasses import dataclass, field

from assembly.generated_turns import GeneratedTurns
from assembly.tool_calls import ToolCall
from server.api_responses.schemas import (FunctionCallItem, FunctionCallOutputItem, MessageItem, NamedFunction,
                                          ResponsesRequest)
from server.errors import invalid_request
from server.job import TTL_SECONDS, CacheBreakpoint, ChatJob, OutputFormat, named_tool_choice, requested_engine_options
from server.response_store import StoredResponse
from server.tool_turns import find_tool_turn_problem

_ROLE = {"developer": "system"}


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


@dataclass
class ResponsesPrompt:
    conversation: list[dict] = field(default_factory=list)  # stored one + this input, instructions aside
    sources: list[str] = field(default_factory=list)  # per message of `messages`
    breakpoints: list[CacheBreakpoint] = field(default_factory=list)  # indices into `messages`
    instructions: str | None = None

    @property
    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        return head + self.conversation

    @property
    def num_head_messages(self) -> int:
        return 1 if self.instructions is not None else 0


def responses_prompt(request: ResponsesRequest, previous: StoredResponse | None) -> ResponsesPrompt:
    prompt = ResponsesPrompt(instructions=request.instructions)
    if request.instructions is not None:
        prompt.sources.append("instructions")
    if previous is not None:
        prompt.conversation += previous.messages
        prompt.sources += ["previous_response"] * len(previous.messages)
    default_ttl = request.prompt_cache_options.ttl if request.prompt_cache_options is not None else "30m"
    for i, item in enumerate(request.input_items):
        source = f"input[{i}]"
        last = prompt.conversation[-1] if prompt.conversation else None
        if isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if last is not None and last["role"] == "assistant" and prompt.sources[-1] != "previous_response":
                last.setdefault("tool_calls", []).append(call)
                if not (last.get("content") or "").strip():
                    last["content"] = None
            else:
                _add(prompt, {"role": "assistant", "content": None, "tool_calls": [call]}, source)
        elif isinstance(item, FunctionCallOutputItem):
            _add(prompt, {"role": "tool", "tool_call_id": item.call_id, "content": item.text}, source)
        else:
            _add_message(prompt, item, source, default_ttl)
    if request.prompt_cache_retention == "24h" and prompt.conversation:
        prompt.breakpoints.append(CacheBreakpoint(len(prompt.messages) - 1, TTL_SECONDS["24h"]))
    _check_tool_turns(prompt)
    return prompt


def _check_tool_turns(prompt: ResponsesPrompt) -> None:
    """Outputs of no call, and calls with no output: 400s in OpenAI's words (server/tool_turns.py)."""
    problem = find_tool_turn_problem(prompt.messages)
    if problem is None:
        return
    if problem.kind == "unanswered_calls":
        raise invalid_request(f"No tool output found for function call {problem.call_ids[0]}.", param="input")
    raise invalid_request(f"No tool call found for function call output with call_id {problem.call_ids[0]}.",
                          param="input")


def _add(prompt: ResponsesPrompt, message: dict, source: str) -> int:
    prompt.conversation.append(message)
    prompt.sources.append(source)
    return len(prompt.messages) - 1


def _add_message(prompt: ResponsesPrompt, item: MessageItem, source: str, default_ttl: str) -> None:
    index = _add(prompt, {"role": _ROLE.get(item.role, item.role), "content": item.text}, source)
    parts = [] if isinstance(item.content, str) else item.content
    for k, part in enumerate(parts):
        if part.prompt_cache_breakpoint is not None:
            content = None if k == len(parts) - 1 else "".join(p.text for p in parts[:k + 1])
            ttl = TTL_SECONDS[part.prompt_cache_breakpoint.ttl or default_ttl]
            prompt.breakpoints.append(CacheBreakpoint(index, ttl, content))


def remember_stored_turns(turns: GeneratedTurns | None, previous: StoredResponse, scope: str) -> None:
    """The stored conversation's generated turns, back into turn memory (it may have forgotten them),
    under the continuing request's scope (Caller.turn_scope)."""
    if turns is None:
        return
    for turn in previous.turns:
        turns.remember(turn["content"], [ToolCall(*call) for call in turn["calls"]], turn["token_ids"], scope)


def responses_job(request: ResponsesRequest, prompt: ResponsesPrompt) -> ChatJob:
    choice = request.tool_choice
    tool_choice = named_tool_choice(choice.name) if isinstance(choice, NamedFunction) else (choice or "auto")
    fmt = request.output_format
    sampling = {name: value for name in ("temperature", "top_p") if (value := getattr(request, name)) is not None}
    tools = []
    for tool in request.tools or ():
        function = {"name": tool.name, "parameters": tool.parameters}
        if tool.description is not None:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
    return ChatJob(
        messages=tuple(prompt.messages),
        tools=tuple(tools),
        tool_choice=tool_choice,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        output_format=OutputFormat(fmt.schema_) if fmt is not None else None,
        sampling=sampling,
        max_new_tokens=request.max_output_tokens,
        model=request.model,
        cache_salt=request.cache_salt,
        prompt_cache_key=request.prompt_cache_key,
        cache_breakpoints=tuple(prompt.breakpoints),
        tool_schema_path="tools[{}].parameters",
        output_format_path="text.format.schema",
        engine_options=requested_engine_options(request.document_reuse, request.speculation),
    )

"""Anthropic Messages <-> the internal job: the request as a ChatJob, the result as a Message body.

Request: `system` (a string or text blocks) becomes the system turn; a user
message's `tool_result` blocks become tool turns (in their order, before its
text), an assistant message's `tool_use` blocks its tool calls (input as JSON
arguments, so turn memory finds the turn it generated and splices its ids).
`cache_control` on a block is a breakpoint at the end of that block; on a tool,
at the end of the system turn (where the tool block is rendered); top-level, on
the last block of the last message, as Anthropic places it. A thread's `continue`
starts from the stored conversation (server/api_anthropic/threads.py). tool_result
blocks that answer no tool_use, and tool_use blocks left unanswered, are 400s.

Tool calls get Anthropic's `toolu_` ids. Usage is server/api_anthropic/usage.py's.
"""

import json
import uuid

from server.api_anthropic.schemas import (CacheControl, CountTokensRequest, MessagesRequest, TextBlock,
                                          ToolResultBlock, ToolUseBlock)
from server.api_anthropic.usage import usage_body
from server.choice_stream import ChoiceResult, Usage
from server.errors import invalid_request
from server.job import (TTL_SECONDS, CacheBreakpoint, ChatJob, GenerationJob, OutputFormat, named_tool_choice,
                        requested_engine_options)
from server.response_store import StoredResponse
from server.tool_turns import find_tool_turn_problem

SYSTEM_JOIN = "\n\n"  # between system text blocks
TOOL_USE_ID_PREFIX = "toolu_"  # Anthropic's tool_use ids

_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def _breakpoint(index: int, cache_control: CacheControl | None, content: str | None = None):
    return None if cache_control is None else CacheBreakpoint(index, TTL_SECONDS[cache_control.ttl], content)


def _system_text(request: CountTokensRequest) -> tuple[str | None, list[CacheBreakpoint]]:
    system = request.system
    if system is None or isinstance(system, str):
        return system, []
    breakpoints = [_breakpoint(0, block.cache_control, SYSTEM_JOIN.join(b.text for b in system[:k + 1]))
                   for k, block in enumerate(system)]
    return SYSTEM_JOIN.join(block.text for block in system), [b for b in breakpoints if b is not None]


class TranslatedPrompt:
    """The messages in OpenAI's shape, where each came from ("system", "messages[3]", "thread"), the tools
    (OpenAI's function shape) and the breakpoints. `thread`: the stored conversation a thread's `continue`
    carries on (its system turn, tools and their breakpoints included); the request's messages follow it."""

    def __init__(self, request: CountTokensRequest, thread: StoredResponse | None = None):
        self.messages: list[dict] = []
        self.sources: list[str] = []
        self.breakpoints: list[CacheBreakpoint] = []
        self.block_paths: dict[int, str] = {}  # a tool turn's block, as Anthropic names it: "messages.2.content.0"
        if thread is not None:
            for message in thread.messages:
                self._add(message, "thread")
            self.tools = list(thread.tools)
            self.breakpoints += [CacheBreakpoint(*fields) for fields in thread.breakpoints]
        else:
            system, system_breakpoints = _system_text(request)
            if system is not None:
                self._add({"role": "system", "content": system}, "system")
                self.breakpoints += system_breakpoints
            self.tools = [_function_tool(tool) for tool in request.tools or ()]
            for tool in request.tools or ():
                if (b := _breakpoint(-1, tool.cache_control)) is not None:
                    self.breakpoints.append(b)
        self.num_thread_breakpoints = len(self.breakpoints)  # the system's and the tools': a thread keeps them
        for i, message in enumerate(request.messages):
            self._add_message(message, i)
        if request.cache_control is not None and self.messages:
            self.breakpoints.append(_breakpoint(len(self.messages) - 1, request.cache_control))
        self._check_tool_choice(request)
        self._check_tool_turns()

    def _check_tool_choice(self, request: CountTokensRequest) -> None:
        """A thread's `continue` names a tool of the thread's tools (the schema checks a request's own)."""
        choice, names = request.tool_choice, {tool["function"]["name"] for tool in self.tools}
        if not request.continues_thread or choice is None:
            return
        if choice.type == "tool" and choice.name not in names:
            raise invalid_request(f"tool_choice names {choice.name!r}, which is not among the thread's tools",
                                  param="tool_choice")
        if choice.type == "any" and not names:
            raise invalid_request("tool_choice 'any' needs tools, and the thread has none", param="tool_choice")

    def _check_tool_turns(self) -> None:
        """tool_result blocks that answer no tool_use of the message before, and tool_use blocks left without
        their tool_result: 400s in Anthropic's words (server/tool_turns.py)."""
        problem = find_tool_turn_problem(self.messages)
        if problem is None:
            return
        source = self.sources[problem.message_index]
        where = source.replace("[", ".").rstrip("]") if source.startswith("messages") else "the thread's last message"
        ids = ", ".join(problem.call_ids)
        if problem.kind == "unanswered_calls":
            raise invalid_request(f"{where}: `tool_use` ids were found without `tool_result` blocks immediately "
                                  f"after: {ids}. Each `tool_use` block must have a corresponding `tool_result` "
                                  "block in the next message.", param="messages")
        raise invalid_request(f"{self.block_paths.get(problem.message_index, where)}: unexpected `tool_use_id` found "
                              f"in `tool_result` blocks: {ids}. Each `tool_result` block must have a corresponding "
                              "`tool_use` block in the previous message.", param="messages")

    def _add(self, message: dict, source: str) -> int:
        self.messages.append(message)
        self.sources.append(source)
        return len(self.messages) - 1

    def _add_message(self, message, position: int) -> None:
        source = f"messages[{position}]"
        blocks = [TextBlock(type="text", text=message.content)] if isinstance(message.content, str) else message.content
        if message.role == "user":
            for k, block in enumerate(blocks):
                if isinstance(block, ToolResultBlock):
                    index = self._add({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text},
                                      source)
                    self.block_paths[index] = f"messages.{position}.content.{k}"
                    self._mark(index, block.cache_control)
            texts = [b for b in blocks if isinstance(b, TextBlock)]
            if texts or not blocks:
                index = self._add({"role": "user", "content": "".join(b.text for b in texts)}, source)
                for k, block in enumerate(texts):
                    last = k == len(texts) - 1
                    self._mark(index, block.cache_control, None if last else "".join(b.text for b in texts[:k + 1]))
            return
        texts = [b for b in blocks if isinstance(b, TextBlock)]
        uses = [b for b in blocks if isinstance(b, ToolUseBlock)]
        content = "".join(b.text for b in texts)
        assistant = {"role": "assistant", "content": content if content or not uses else None}
        if uses:
            assistant["tool_calls"] = [{"id": b.id, "type": "function",
                                        "function": {"name": b.name, "arguments": json.dumps(b.input)}} for b in uses]
        index = self._add(assistant, source)
        for block in blocks:
            self._mark(index, block.cache_control)

    def _mark(self, index: int, cache_control: CacheControl | None, content: str | None = None) -> None:
        if (b := _breakpoint(index, cache_control, content)) is not None:
            self.breakpoints.append(b)


def messages_job(request: CountTokensRequest, prompt: TranslatedPrompt) -> ChatJob:
    choice = request.tool_choice
    if choice is None or choice.type == "auto":
        tool_choice = "auto"
    else:
        tool_choice = {"any": "required", "none": "none"}.get(choice.type) or named_tool_choice(choice.name)
    output_format = None
    if request.output_config is not None and request.output_config.format is not None:
        output_format = OutputFormat(request.output_config.format.schema_)
    sampling, max_new_tokens, stops = {}, None, ()
    if isinstance(request, MessagesRequest):
        sampling = {name: value for name in ("temperature", "top_p", "top_k")
                    if (value := getattr(request, name)) is not None}
        max_new_tokens, stops = request.max_tokens, tuple(request.stop_sequences or ())
    return ChatJob(
        messages=tuple(prompt.messages),
        tools=tuple(prompt.tools),
        tool_choice=tool_choice,
        parallel_tool_calls=not (choice is not None and choice.disable_parallel_tool_use),
        output_format=output_format,
        sampling=sampling,
        max_new_tokens=max_new_tokens,
        stop_strings=stops,
        cache_breakpoints=tuple(prompt.breakpoints),
        tool_schema_path="tools[{}].input_schema",
        output_format_path="output_config.format.schema",
        engine_options=requested_engine_options(request.document_reuse, getattr(request, "speculation", None)),
        tool_call_id_prefix=TOOL_USE_ID_PREFIX,
    )


def _function_tool(tool) -> dict:
    """An Anthropic tool as the OpenAI function the prompt builder renders."""
    function = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def stop_reason(result_finish_reason: str, stop_string: str | None) -> str:
    if result_finish_reason == "stop":
        return "stop_sequence" if stop_string is not None else "end_turn"
    return _STOP_REASONS.get(result_finish_reason, "end_turn")


def content_blocks(result: ChoiceResult) -> list[dict]:
    blocks = []
    if result.content:
        blocks.append({"type": "text", "text": result.text})
    for call in result.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _arguments(call.arguments)})
    return blocks


def _arguments(arguments: str) -> dict:
    """The call's JSON arguments as an object (a grammar guarantees this for forced calls)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def message_body(message_id: str, model: str, result: ChoiceResult, usage: Usage, job: GenerationJob,
                 page_size: int, diagnostics: dict | None) -> dict:
    body = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(result),
        "stop_reason": stop_reason(result.finish_reason, result.stop_string),
        "stop_sequence": result.stop_string,
        "usage": usage_body(usage, job, page_size),
    }
    if diagnostics is not None:
        body["diagnostics"] = diagnostics
    return body

"""Chat Completions' request -> the internal ChatJob (server/job.py)."""

from collections.abc import Sequence

from server.errors import invalid_request
from server.job import ChatJob, OutputFormat, named_tool_choice, requested_engine_options
from server.sampling import sampling_fields
from server.schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice
from server.tool_turns import find_tool_turn_problem

# Roles the template sees: OpenAI's `developer` is the newer name of `system`.
_TEMPLATE_ROLE = {"developer": "system"}


def template_message(message: ChatMessage) -> dict:
    """A message as templates (and GeneratedTurns) see it: OpenAI's shape, plain dicts."""
    rendered = {"role": _TEMPLATE_ROLE.get(message.role, message.role), "content": message.content}
    if message.content is None and message.role != "assistant":
        rendered["content"] = ""
    for key in ("name", "tool_call_id"):
        value = getattr(message, key)
        if value is not None:
            rendered[key] = value
    if message.tool_calls:
        rendered["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    return rendered


def check_tool_turns(messages: Sequence[dict]) -> None:
    """Tool turns that answer no call, and unanswered calls: 400s in OpenAI's words (server/tool_turns.py)."""
    problem = find_tool_turn_problem(messages)
    if problem is None:
        return
    i = problem.message_index
    if problem.kind == "missing_call_id":
        raise invalid_request(f"Missing required parameter: 'messages[{i}].tool_call_id'.",
                              param=f"messages[{i}].tool_call_id", code="missing_required_parameter")
    if problem.kind == "no_call_before":
        raise invalid_request("Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                              "message with 'tool_calls'.", param=f"messages[{i}].role")
    if problem.kind == "unknown_call_id":
        raise invalid_request(f"Invalid parameter: 'tool_call_id' of '{problem.call_ids[0]}' not found in "
                              "'tool_calls' of previous message.", param=f"messages[{i}].tool_call_id")
    raise invalid_request("An assistant message with 'tool_calls' must be followed by tool messages responding to "
                          "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                          + ", ".join(problem.call_ids), param=f"messages[{i}].role")


def chat_job(request: ChatCompletionRequest, retrieved_documents: Sequence[dict] = ()) -> ChatJob:
    """`retrieved_documents` go into the prompt after the request's own documents. Raises APIError for
    tool turns out of order."""
    messages = tuple(template_message(m) for m in request.messages)
    check_tool_turns(messages)
    choice = request.tool_choice
    if isinstance(choice, NamedToolChoice):
        tool_choice = named_tool_choice(choice.function.name)
    else:
        tool_choice = choice or "auto"
    output_format = None
    if request.response_format is not None and request.response_format.type != "text":
        spec = request.response_format.json_schema
        output_format = OutputFormat(spec.schema_ if spec is not None else None)
    documents = [d.model_dump(exclude_none=True) for d in request.documents or ()] + list(retrieved_documents)
    return ChatJob(
        messages=messages,
        tools=tuple(tool.model_dump(exclude_none=True) for tool in request.tools or ()),
        tool_choice=tool_choice,
        parallel_tool_calls=request.parallel_tool_calls,
        output_format=output_format,
        documents=tuple(documents),
        template_kwargs=request.chat_template_kwargs,
        sampling=sampling_fields(request),
        max_new_tokens=request.max_new_tokens,
        stop_strings=tuple(request.stop or ()),
        num_choices=request.n,
        model=request.model,
        cache_salt=request.cache_salt,
        prompt_cache_key=request.prompt_cache_key,
        cache_breakpoints=tuple(request.cache_breakpoints),
        engine_options=requested_engine_options(request.document_reuse, request.speculation),
    )

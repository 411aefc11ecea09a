"""Chat Completions' request -> the internal ChatJob (server/job.py)."""

from collections.abc import Sequence

from server.job import ChatJob, OutputFormat, named_tool_choice, requested_document_reuse
from server.sampling import sampling_fields
from server.schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice

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


def chat_job(request: ChatCompletionRequest, retrieved_documents: Sequence[dict] = ()) -> ChatJob:
    """`retrieved_documents` go into the prompt after the request's own documents."""
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
        messages=tuple(template_message(m) for m in request.messages),
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
        document_reuse=requested_document_reuse(request.document_reuse),
    )

"""Validated requests -> prompt token ids (chat through assembly's prompt builder)."""

from collections.abc import Sequence

from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import PromptTooLong, SegmentTokenizer
from server.errors import invalid_request
from server.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest

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


class RequestPrompts:
    def __init__(self, builder: PromptBuilder):
        self.builder = builder
        self.segments: SegmentTokenizer = builder.tokenizer
        self.tokenizer = builder.tokenizer.tokenizer  # for decoding

    def chat_prompt_ids(self, request: ChatCompletionRequest, retrieved_documents: Sequence[dict] = (),
                        max_num_tokens: int | None = None) -> list[int]:
        """Raises TemplateError when the template refuses these messages; a 400 when the prompt
        surely exceeds `max_num_tokens` (judged from its length, before tokenizing)."""
        tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if request.tools else None
        documents = [d.model_dump(exclude_none=True) for d in request.documents or ()] + list(retrieved_documents)
        try:
            token_ids = self.builder.build([template_message(m) for m in request.messages], tools=tools,
                                           documents=documents or None, template_kwargs=request.chat_template_kwargs,
                                           max_num_tokens=max_num_tokens)
        except PromptTooLong as error:
            raise invalid_request(f"messages: {error}", param="messages") from None
        return self._non_empty(token_ids, "messages")

    def completion_prompt_ids(self, request: CompletionRequest, max_num_tokens: int | None = None) -> list[int]:
        prompt = request.prompt
        if isinstance(prompt, str):
            try:
                self.segments.check_fits([prompt], max_num_tokens)
            except PromptTooLong as error:
                raise invalid_request(f"prompt: {error}", param="prompt") from None
        token_ids = self.segments.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return self._non_empty(token_ids, "prompt")

    @staticmethod
    def _non_empty(token_ids: list[int], param: str) -> list[int]:
        if not token_ids:
            raise invalid_request(f"{param}: the prompt is empty", param=param)
        return token_ids

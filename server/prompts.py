"""Validated requests -> prompt token ids (chat through the model's template)."""

from assembly.chat_template import ChatTemplate
from assembly.tokenizer import Tokenizer
from server.errors import invalid_request
from server.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest

# Roles the template sees: OpenAI's `developer` is the newer name of `system`.
_TEMPLATE_ROLE = {"developer": "system"}


def _template_message(message: ChatMessage) -> dict:
    rendered = {"role": _TEMPLATE_ROLE.get(message.role, message.role), "content": message.content or ""}
    for key in ("name", "tool_calls", "tool_call_id"):
        value = getattr(message, key)
        if value is not None:
            rendered[key] = value
    return rendered


class PromptBuilder:
    def __init__(self, tokenizer: Tokenizer, chat_template: ChatTemplate):
        self.tokenizer = tokenizer
        self.chat_template = chat_template

    def chat_prompt_ids(self, request: ChatCompletionRequest) -> list[int]:
        """Raises TemplateError when the template refuses these messages."""
        tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if request.tools else None
        text = self.chat_template.render([_template_message(m) for m in request.messages],
                                         add_generation_prompt=True, tools=tools)
        return self._non_empty(self.tokenizer.encode(text), "messages")

    def completion_prompt_ids(self, request: CompletionRequest) -> list[int]:
        prompt = request.prompt
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return self._non_empty(token_ids, "prompt")

    @staticmethod
    def _non_empty(token_ids: list[int], param: str) -> list[int]:
        if not token_ids:
            raise invalid_request(f"{param}: the prompt is empty", param=param)
        return token_ids

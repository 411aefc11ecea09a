"""Request bodies of OpenAI's Responses API (`POST /v1/responses`), validated by pydantic.

The official client's types (openai 3.x, types/responses/response_create_params.py)
are the reference. Input items: messages (text parts, `input_text` /
`output_text`), `function_call` and `function_call_output`, as a client sends a
conversation back. Function tools only. The base is server/request_body.py's (strict
types, `null` in an optional field is "not given", as the official client sends None,
numbers finite). Unknown fields are refused (400), and so
are the client's fields this server cannot honour (`background`, `conversation`,
`prompt`, reasoning, built-in tools, non-text parts), each named.
"""

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from engine.sampling_params import MAX_TEMPERATURE
from server.request_body import FiniteJSON, RequestBody, refuse_fields
from server.schemas import MAX_TOOLS
from server.schemas_prompt_cache import PromptCacheBreakpoint, PromptCacheOptions

UNSUPPORTED_FIELDS = ("background", "conversation", "prompt", "max_tool_calls", "context_management",
                      "moderation", "image", "background_options", "access_programs")


class _Body(RequestBody):
    """request_body.py's rules (strict, null is "not given", numbers finite); unknown fields refused."""

    model_config = ConfigDict(extra="forbid")


class TextPart(_Body):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # output_text sent back: no annotations are made here
    logprobs: list[Any] | None = None
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = None


def _supported_parts(value: Any) -> Any:
    for part in value if isinstance(value, list) else ():
        if isinstance(part, dict) and part.get("type") not in ("input_text", "output_text"):
            raise ValueError(f"content parts of type {part.get('type')!r} are not supported; only text parts are")
    return value


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[TextPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _text_parts_only(cls, data):
        if isinstance(data, dict):
            _supported_parts(data.get("content"))
        return data

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str | list[TextPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @property
    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


def _item_type(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type", "message") not in ("message", "function_call",
                                                                        "function_call_output"):
        raise ValueError(f"input items of type {value.get('type')!r} are not supported; this server takes "
                         "message, function_call and function_call_output")
    return value


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem,
                      Field(discriminator="type")]


class FunctionTool(_Body):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
    description: str | None = None
    parameters: dict[str, FiniteJSON] | None = None
    strict: bool | None = None


class NamedFunction(_Body):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1)]


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    schema_: Annotated[dict[str, FiniteJSON] | None, Field(alias="schema")] = None
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if self.type == "json_schema" and (self.schema_ is None or self.name is None):
            raise ValueError("format json_schema needs a name and a schema")
        return self


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # the only verbosity this model has


class Reasoning(_Body):
    effort: Literal["none"] | None = None  # this model does not reason
    summary: None = None


class ResponsesRequest(_Body):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=MAX_TEMPERATURE)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    text: TextConfig | None = None
    store: bool | None = None  # default true, as OpenAI
    previous_response_id: Annotated[str, Field(min_length=1)] | None = None
    stream: bool | None = None
    stream_options: dict[str, bool] | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    truncation: Literal["disabled"] | None = None
    reasoning: Reasoning | None = None
    service_tier: Literal["auto", "default"] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    top_logprobs: Literal[0] | None = None
    cache_salt: Annotated[str, Field(min_length=1)] | None = None  # extension: tenants share KV only with the same salt
    document_reuse: bool | None = None  # extension: false, this request reuses no stored document KV
    speculation: bool | None = None  # extension: false turns draft-free speculative decoding off for this request

    @model_validator(mode="before")
    @classmethod
    def _no_unsupported_fields(cls, data):
        refuse_fields(data, UNSUPPORTED_FIELDS)
        if isinstance(data, dict):
            for tool in data["tools"] if isinstance(data.get("tools"), list) else ():  # else: the field's own error
                if isinstance(tool, dict) and tool.get("type") != "function":
                    raise ValueError(f"tools of type {tool.get('type')!r} are not supported; only function tools")
            if isinstance(data.get("input"), list):
                data = {**data, "input": [{"type": "message", **item} if isinstance(item, dict) and "type" not in item
                                          else item for item in data["input"]]}
                for item in data["input"]:
                    _item_type(item)
                    if isinstance(item, dict):
                        _supported_parts(item.get("content") if item["type"] == "message" else item.get("output"))
            if data.get("include"):
                raise ValueError("include is not supported by this server (nothing extra to include)")
        return data

    @model_validator(mode="after")
    def _tool_choice_fits_tools(self):
        names = {tool.name for tool in self.tools or ()}
        choice = self.tool_choice
        if isinstance(choice, NamedFunction) and choice.name not in names:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among tools")
        if choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        if self.input == [] and self.previous_response_id is None:
            raise ValueError("input must not be empty")
        return self

    @property
    def output_format(self) -> TextFormat | None:
        fmt = self.text.format if self.text is not None else None
        return fmt if fmt is not None and fmt.type != "text" else None

    @property
    def input_items(self) -> list:
        return [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else list(self.input)

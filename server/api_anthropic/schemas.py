"""Request bodies of Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`), validated by pydantic.

The fields of the official client (anthropic 2.x, types/message_create_params.py)
are the reference. The base is server/request_body.py's (strict types, `null` in an
optional field is "not given", numbers finite). Unknown fields are refused (400), and so are the client's
fields this server cannot honour (`thinking` other than disabled, `container`,
`inference_geo`, `speed: fast`, image / document / thinking blocks, server
tools), each with a message that names it.
"""

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from server.request_body import FiniteJSON, RequestBody, refuse_fields
from server.schemas import MAX_STOP_STRINGS, MAX_TOOLS

MAX_TEMPERATURE = 1.0  # Anthropic's range is [0, 1]
MAX_CACHE_CONTROLS = 4  # as Anthropic: each is a pin, so they are bounded

# Fields the official client sends that this server does not honour; named in the 400.
UNSUPPORTED_FIELDS = ("container", "inference_geo", "user_profile_id", "workspace_id", "mcp_servers",
                      "context_management")


class _Body(RequestBody):
    """request_body.py's rules (strict, null is "not given", numbers finite); unknown fields refused."""

    model_config = ConfigDict(extra="forbid")


class CacheControl(_Body):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"


class TextBlock(_Body):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: None = None


class ToolUseBlock(_Body):
    type: Literal["tool_use"]
    id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    input: dict[str, FiniteJSON]
    cache_control: CacheControl | None = None


class ToolResultBlock(_Body):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, Field(min_length=1)]
    content: str | list[TextBlock] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(block.text for block in self.content)


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


def _check_block_type(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") not in ("text", "tool_use", "tool_result"):
        raise ValueError(f"content blocks of type {value.get('type')!r} are not supported; "
                         "this server takes text, tool_use and tool_result")
    return value


class Message(_Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    @model_validator(mode="before")
    @classmethod
    def _supported_blocks(cls, data):
        if isinstance(data, dict) and isinstance(data.get("content"), list):
            for block in data["content"]:
                _check_block_type(block)
        return data

    @model_validator(mode="after")
    def _blocks_fit_the_role(self):
        blocks = [] if isinstance(self.content, str) else self.content
        if self.role == "user" and any(isinstance(b, ToolUseBlock) for b in blocks):
            raise ValueError("tool_use blocks belong to assistant messages")
        if self.role == "assistant" and any(isinstance(b, ToolResultBlock) for b in blocks):
            raise ValueError("tool_result blocks belong to user messages")
        return self


class Tool(_Body):
    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9_-]+$")]
    input_schema: dict[str, FiniteJSON]
    description: str | None = None
    cache_control: CacheControl | None = None
    type: Literal["custom"] | None = None
    strict: bool | None = None


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: Annotated[str, Field(min_length=1)] | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _name_with_tool(self):
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("tool_choice type 'tool' needs a name (and only it takes one)")
        return self


class Metadata(_Body):
    user_id: Annotated[str, Field(max_length=256)] | None = None


class JSONOutputFormat(_Body):
    type: Literal["json_schema"]
    schema_: Annotated[dict[str, FiniteJSON], Field(alias="schema")]


class OutputConfig(_Body):
    format: JSONOutputFormat | None = None
    effort: None = None  # reasoning effort: this model does not reason


class Thinking(_Body):
    type: Literal["disabled"]  # enabled / adaptive thinking: this model does not think


class Diagnostics(_Body):
    previous_message_id: Annotated[str, Field(min_length=1)] | None = None


class ThreadCreate(_Body):
    type: Literal["create"]


class ThreadContinue(_Body):
    type: Literal["continue"]
    previous_message_id: Annotated[str, Field(min_length=1)]


Thread = Annotated[ThreadCreate | ThreadContinue, Field(discriminator="type")]


class _PromptFields(_Body):
    """What /v1/messages and /v1/messages/count_tokens share: what makes the prompt."""

    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    cache_control: CacheControl | None = None
    output_config: OutputConfig | None = None
    thinking: Thinking | None = None
    speed: Literal["standard"] | None = None
    document_reuse: bool | None = None  # extension: false, this request reuses no stored document KV

    @model_validator(mode="before")
    @classmethod
    def _no_unsupported_fields(cls, data):
        refuse_fields(data, UNSUPPORTED_FIELDS)
        if isinstance(data, dict) and isinstance(data.get("tools"), list):  # not a list: the field's own error
            for tool in data["tools"]:
                if isinstance(tool, dict) and tool.get("type") not in (None, "custom"):
                    raise ValueError(f"server tools ({tool.get('type')!r}) are not supported; "
                                     "give custom tools with name and input_schema")
        return data

    @property
    def continues_thread(self) -> bool:
        """A thread's later turn: its system and tools are the thread's (server/api_anthropic/threads.py)."""
        return isinstance(getattr(self, "thread", None), ThreadContinue)

    @model_validator(mode="after")
    def _tool_choice_fits_tools(self):
        names = {tool.name for tool in self.tools or ()}
        choice = self.tool_choice
        if self.continues_thread:
            for field in ("system", "tools"):
                if getattr(self, field) is not None:
                    raise ValueError(f"`{field}` cannot be sent on a thread `continue`: the thread keeps the "
                                     f"`{field}` it was created with")
        elif choice is not None and choice.type == "tool" and choice.name not in names:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among tools")
        if choice is not None and choice.type == "any" and not names and not self.continues_thread:
            raise ValueError("tool_choice 'any' needs tools")
        if self.forces_tool_use and self.output_config is not None and self.output_config.format is not None:
            raise ValueError("a forced tool use and output_config.format cannot be combined")
        if self.num_cache_controls > MAX_CACHE_CONTROLS:
            raise ValueError(f"a maximum of {MAX_CACHE_CONTROLS} blocks with cache_control may be provided, "
                             f"got {self.num_cache_controls}")
        return self

    @property
    def num_cache_controls(self) -> int:
        blocks = [*(self.system if isinstance(self.system, list) else ()), *(self.tools or ())]
        for message in self.messages:
            blocks += [] if isinstance(message.content, str) else message.content
        return sum(block.cache_control is not None for block in blocks) + (self.cache_control is not None)

    @property
    def forces_tool_use(self) -> bool:
        return self.tool_choice is not None and self.tool_choice.type in ("any", "tool")


class CountTokensRequest(_PromptFields):
    pass


class MessagesRequest(_PromptFields):
    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1)]],
                              Field(max_length=MAX_STOP_STRINGS)] | None = None
    temperature: Annotated[float, Field(ge=0, le=MAX_TEMPERATURE)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=1)] | None = None
    metadata: Metadata | None = None
    stream: bool = False
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: both mean it
    diagnostics: Diagnostics | None = None
    speculation: bool | None = None  # extension: false turns draft-free speculative decoding off for this request
    thread: Thread | None = None  # a message thread: the server holds the conversation (api_anthropic/threads.py)

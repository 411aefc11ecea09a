"""Request bodies of the OpenAI-compatible routes, validated by pydantic.

Every body is a `RequestBody` (server/request_body.py): strict types, `null` in an
optional field means "not given", numbers finite. Ranges as OpenAI documents them,
and as `SamplingParams` checks them again. Fields the API has but we do not use are
ignored, except those whose effect a client would miss (`suffix`, `best_of` other
than n): those are refused. Extensions: `documents`
(rendered into the prompt by the assembly layer), `retrieval` (documents from a
collection) and `chat_template_kwargs`.
Values are normalised here (content parts joined, prompts as a list of str | ids)
so the service sees one shape.
"""

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from engine.sampling_params import (MAX_ABS_LOGIT_BIAS, MAX_ABS_PENALTY, MAX_DRY_BASE, MAX_DRY_MULTIPLIER, MAX_LOGPROBS,
                                    MAX_TEMPERATURE)
from server.request_body import FiniteJSON, RequestBody
from server.schemas_prompt_cache import PromptCacheFields
from server.settings import MAX_CHOICES

MAX_STOP_STRINGS = 4
MAX_TOOLS = 128  # OpenAI's limit; each tool is a branch of the grammar a forced call compiles


def _content_text(value: Any) -> Any:
    """A message's content as one string: a string, or a list of text parts joined."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ValueError("content must be a string or a list of text parts")
    texts = []
    for i, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"content part {i} is of type {kind!r}; only text parts are supported")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"content part {i} needs a string 'text'")
        texts.append(part["text"])
    return "".join(texts)


def _stop_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


MAX_PROMPTS = 64  # prompts in one /v1/completions request (each gets its n choices)

# What a client may send (the OpenAPI document shows these; validators normalise them).
_Text = Annotated[str, Field(min_length=1)]
_TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
_PromptInput = (_Text | Annotated[list[_Text], Field(min_length=1, max_length=MAX_PROMPTS)]
                | _TokenIds | Annotated[list[_TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)])
_StopInput = _Text | Annotated[list[_Text], Field(max_length=MAX_STOP_STRINGS)] | None
_TextPart = dict[Literal["type", "text"], str]


def _is_token_ids(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value))


def _prompts(value: Any) -> Any:
    """str | [str, ...] | [int, ...] | [[int, ...], ...] -> a list of prompts, each str | list[int]."""
    if isinstance(value, str) or _is_token_ids(value):
        return [value]
    if isinstance(value, list) and value and (all(isinstance(p, str) for p in value)
                                              or all(_is_token_ids(p) for p in value)):
        if len(value) > MAX_PROMPTS:
            raise ValueError(f"{len(value)} prompts in one request; at most {MAX_PROMPTS}")
        return value
    raise ValueError("prompt must be a string, a list of strings, a list of token ids (integers >= 0) "
                     "or a list of such lists (not a mix)")


_Body = RequestBody


class CalledFunction(_Body):
    name: Annotated[str, Field(min_length=1)]
    arguments: str  # JSON text, as OpenAI sends it


class AssistantToolCall(_Body):
    id: Annotated[str, Field(min_length=1)]
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str | None,
                       BeforeValidator(_content_text, json_schema_input_type=str | list[_TextPart] | None)] = None
    name: str | None = None
    tool_calls: list[AssistantToolCall] | None = None  # an assistant turn's calls, re-rendered by the template
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _needs_content(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # extension, as vLLM: with include_usage, the usage so far on every chunk


class FunctionSpec(_Body):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, FiniteJSON] | None = None


class ToolSpec(_Body):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Body):
    name: Annotated[str, Field(min_length=1)]


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaSpec(_Body):
    name: Annotated[str, Field(min_length=1, max_length=64)] = "response"
    description: str | None = None
    schema_: Annotated[dict[str, FiniteJSON] | None, Field(alias="schema")] = None
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs a json_schema object")
        return self


MAX_RETRIEVAL_TOP_K = 32


class RetrievalSpec(_Body):
    """Server-side RAG (extension): the top chunks of a collection become the prompt's documents."""

    collection: Annotated[str, Field(min_length=1)]
    top_k: Annotated[int, Field(ge=1, le=MAX_RETRIEVAL_TOP_K)] = 4
    query: Annotated[str, Field(min_length=1)] | None = None  # default: the last user message


class Document(_Body):
    """A document for the prompt (extension); rendered after the system prompt and tools."""

    text: Annotated[str, Field(min_length=1)]
    id: str | None = None
    title: str | None = None


class _SamplingFields(_Body):
    """What chat and legacy completions share."""

    model: str | None = None  # None: the served model
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=MAX_TEMPERATURE)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    presence_penalty: Annotated[float, Field(ge=-MAX_ABS_PENALTY, le=MAX_ABS_PENALTY)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-MAX_ABS_PENALTY, le=MAX_ABS_PENALTY)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    # extension, as llama.cpp's server: DRY, the penalty on tokens that would lengthen a verbatim repeat
    dry_multiplier: Annotated[float, Field(ge=0, le=MAX_DRY_MULTIPLIER)] | None = None
    dry_base: Annotated[float, Field(gt=1, le=MAX_DRY_BASE)] | None = None
    dry_allowed_length: Annotated[int, Field(ge=1)] | None = None
    logit_bias: dict[Annotated[str, Field(pattern=r"^\d+$")],
                     Annotated[float, Field(ge=-MAX_ABS_LOGIT_BIAS, le=MAX_ABS_LOGIT_BIAS)]] | None = None
    seed: int | None = None
    stop: Annotated[Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_STRINGS)] | None,
                    BeforeValidator(_stop_list, json_schema_input_type=_StopInput)] = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None  # extension, as vLLM
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    cache_salt: Annotated[str, Field(min_length=1)] | None = None  # extension: tenants share KV only with the same salt
    ignore_eos: bool = False  # extension
    document_reuse: bool | None = None  # extension: false, this request reuses no stored document KV
    speculation: bool | None = None  # extension: false turns draft-free speculative decoding off for this request

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    @property
    def include_usage_chunk(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    @property
    def usage_on_every_chunk(self) -> bool:
        """vLLM's `continuous_usage_stats` (with include_usage): each chunk carries the usage so far."""
        return self.include_usage_chunk and self.stream_options.continuous_usage_stats


class ChatCompletionRequest(PromptCacheFields, _SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: Annotated[list[ToolSpec], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    documents: list[Document] | None = None  # extension
    retrieval: RetrievalSpec | None = None  # extension
    chat_template_kwargs: dict[str, FiniteJSON] | None = None  # extension: more variables for the template

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value

    @model_validator(mode="after")
    def _tool_choice_fits_tools(self):
        choice = self.tool_choice
        names = {tool.function.name for tool in self.tools or ()}
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not among tools")
        if choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        if self.forces_tool_call and self.response_format is not None and self.response_format.type != "text":
            raise ValueError("a forced tool call and a JSON response_format cannot be combined")
        return self

    @property
    def forces_tool_call(self) -> bool:
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    @property
    def parses_tool_calls(self) -> bool:
        """Whether the output is read for tool calls: tools given and not tool_choice none."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_top_logprobs(self) -> int | None:
        """The engine's `logprobs`: None (none), or top alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_SamplingFields):
    prompt: Annotated[list[str] | list[list[int]], BeforeValidator(_prompts, json_schema_input_type=_PromptInput)]
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool = False  # the prompt's text (and, with logprobs, its tokens' logprobs) before each choice's
    suffix: None = None
    best_of: int | None = None

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value, info: ValidationInfo):
        if value is not None and value != info.data.get("n"):
            raise ValueError("best_of other than n is not supported")
        return value

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_tokens  # None: the server's default (not OpenAI's 16: vLLM and llama.cpp do not cut there)

    @property
    def num_top_logprobs(self) -> int | None:
        return self.logprobs

"""The internal job every API translates onto, and the prepared job the engine runs.

Chat Completions, Anthropic Messages and OpenAI Responses each map their
request to one `ChatJob` (messages in OpenAI's shape, tools, documents,
sampling, output format, cache hints), so assembly, grammar, tool parsing,
turn memory and pins are written once (server/completion_service.py).
`GenerationJob` is that job prepared: its prompt token ids, SamplingParams,
grammar and the pins to set when it finishes. Legacy completions build a
GenerationJob directly.
"""

from dataclasses import dataclass, field
from typing import Any

from engine.request_options import DEFAULT_REQUEST_OPTIONS, RequestOptions
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class CacheBreakpoint:
    """The end of a reusable prompt prefix, pinned in the cache for `seconds` once the turn ran.

    The prefix ends after message `message_index` of ChatJob.messages, or, with `content` set,
    after that text of its content (a breakpoint on a content part that is not the message's
    last). `message_index` -1: after the system turn with the tool and document blocks."""

    message_index: int
    seconds: float
    content: str | None = None


@dataclass(frozen=True)
class OutputFormat:
    """JSON output: any JSON object (schema None) or one fitting `schema`."""

    schema: dict[str, Any] | None = None


@dataclass(frozen=True)
class ChatJob:
    messages: tuple[dict, ...]  # OpenAI's shape (role, content, tool_calls, tool_call_id), as templates see them
    tools: tuple[dict, ...] = ()  # {"type": "function", "function": {"name", "description", "parameters"}}
    tool_choice: str = "auto"  # "none" | "auto" | "required" | "function:<name>"
    parallel_tool_calls: bool = True
    output_format: OutputFormat | None = None
    documents: tuple[dict, ...] = ()  # {"text", "id", "title"}
    template_kwargs: dict[str, Any] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields, max_tokens aside
    max_new_tokens: int | None = None  # None: the server's default (server/generation_defaults.py)
    stop_strings: tuple[str, ...] = ()
    num_choices: int = 1
    model: str | None = None  # None: the served model
    cache_salt: str | None = None  # tenants share KV only with the same salt
    prompt_cache_key: str | None = None  # OpenAI's cache scope: turn memory's, and the replica affinity key
    # Whose turn memory the prompt splices from (the API key, salt and prompt_cache_key); set by
    # CompletionService.prepare (turn_scope there), "" before.
    turn_scope: str = ""
    cache_breakpoints: tuple[CacheBreakpoint, ...] = ()
    remembers_turn: bool = True  # the finished turn's ids go into turn memory for the next prompt
    # Per-request engine switches as sent (document reuse, speculation); prepare adds the document spans.
    engine_options: RequestOptions = DEFAULT_REQUEST_OPTIONS
    # Where the request holds tool i's parameter schema and the output format's schema, in its own API's
    # names: for the 400s about a schema (its first part is the error's param).
    tool_schema_path: str = "tools[{}].function.parameters"
    output_format_path: str = "response_format.json_schema.schema"
    tool_call_id_prefix: str = "call_"  # the API's style of tool-call ids: "toolu_" for Anthropic's

    @property
    def named_tool(self) -> str | None:
        return self.tool_choice.removeprefix("function:") if self.tool_choice.startswith("function:") else None

    @property
    def forces_tool_call(self) -> bool:
        return self.tool_choice == "required" or self.named_tool is not None

    @property
    def parses_tool_calls(self) -> bool:
        """Whether the output is read for tool calls: tools given and not tool_choice none."""
        return bool(self.tools) and self.tool_choice != "none"


def requested_engine_options(document_reuse: bool | None, speculation: bool | None) -> RequestOptions:
    """A body's `document_reuse` and `speculation` as RequestOptions: a request may switch either
    off for itself (derived KV is its choice to refuse), never on where the server has it off."""
    return RequestOptions(document_reuse=False if document_reuse is False else None,
                          speculation=False if speculation is False else None)


def named_tool_choice(name: str) -> str:
    return f"function:{name}"


@dataclass(frozen=True)
class PrefixPin:
    num_tokens: int  # the prompt's first num_tokens ids
    seconds: float  # how long it stays pinned (the TTL asked, at most --max-pin-seconds)
    ttl_seconds: float | None = None  # the TTL the breakpoint asked for (Anthropic's usage names it); None: `seconds`


@dataclass(frozen=True)
class GenerationJob:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stop_strings: tuple[str, ...] = ()
    num_choices: int = 1
    cache_salt: str | None = None
    grammar: str | None = None  # llguidance grammar the output must follow
    parses_tool_calls: bool = False
    is_chat: bool = False  # chat turns are remembered for splicing into the next prompt
    pins: tuple[PrefixPin, ...] = ()  # set once choice 0 finishes, when its prompt is in the tree
    turn_scope: str = ""  # the finished turn is remembered under this scope (ChatJob.turn_scope)
    affinity_key: str | None = None  # prompt_cache_key: the replica router's affinity key
    engine_options: RequestOptions = DEFAULT_REQUEST_OPTIONS  # KV reuse and decoding switches, as sent
    tool_call_id_prefix: str = "call_"  # ChatJob.tool_call_id_prefix

    @property
    def num_breakpoint_tokens(self) -> int:
        """The longest prefix a cache breakpoint asked to keep (0: none)."""
        return max((pin.num_tokens for pin in self.pins), default=0)


TTL_SECONDS = {"5m": 300.0, "30m": 1800.0, "1h": 3600.0, "12h": 43200.0, "24h": 86400.0}  # the APIs' TTL names

"""OpenAI's prompt-cache controls, as the official client (openai 3.x) types them.

`prompt_cache_key` (a caller's cache scope and, with replicas, the routing
affinity key), `prompt_cache_options` (`mode`, `ttl`, `comparison_response_id`),
the deprecated `prompt_cache_retention`, and `prompt_cache_breakpoint` on a
content part: the exact end of a reusable prefix, pinned for its TTL. Parts are
joined into one string by the message schema, so their breakpoints are read
from the raw body here, before that.
"""

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from server.job import TTL_SECONDS, CacheBreakpoint
from server.request_body import RequestBody

MAX_BREAKPOINTS = 4  # as OpenAI: a request writes up to four


class PromptCacheOptions(RequestBody):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["implicit", "explicit"] = "implicit"
    ttl: Literal["30m", "12h"] = "30m"
    comparison_response_id: Annotated[str, Field(min_length=1)] | None = None


class PromptCacheBreakpoint(RequestBody):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["explicit"]
    ttl: Literal["30m", "12h"] | None = None


def part_breakpoints(messages: Any, default_ttl: str, parts_key: str = "content") -> list[CacheBreakpoint]:
    """Breakpoints on the content parts of raw messages. Raises ValueError for a malformed one."""
    found = []
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        parts = message.get(parts_key) if isinstance(message, dict) else None
        if not isinstance(parts, list):
            continue
        for k, part in enumerate(parts):
            if not isinstance(part, dict) or part.get("prompt_cache_breakpoint") is None:
                continue
            breakpoint = PromptCacheBreakpoint.model_validate(part["prompt_cache_breakpoint"])
            is_last = k == len(parts) - 1
            text = None if is_last else "".join(p.get("text", "") for p in parts[:k + 1] if isinstance(p, dict))
            found.append(CacheBreakpoint(i, TTL_SECONDS[breakpoint.ttl or default_ttl], text))
    if len(found) > MAX_BREAKPOINTS:
        raise ValueError(f"at most {MAX_BREAKPOINTS} prompt_cache_breakpoint parts per request, got {len(found)}")
    return found


class PromptCacheFields(RequestBody):
    """Mixed into Chat Completions' request schema (its `messages`)."""

    prompt_cache_key: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None  # deprecated by OpenAI
    _part_breakpoints: list[CacheBreakpoint] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _read_part_breakpoints(cls, data, handler):
        model = handler(data)
        if isinstance(data, dict):
            ttl = model.prompt_cache_options.ttl if model.prompt_cache_options is not None else "30m"
            model._part_breakpoints = part_breakpoints(data.get("messages"), ttl)
        return model

    @property
    def cache_breakpoints(self) -> list[CacheBreakpoint]:
        """The content-part breakpoints; `prompt_cache_retention: 24h` adds one at the prompt's end."""
        breakpoints = list(self._part_breakpoints)
        if self.prompt_cache_retention == "24h":
            breakpoints.append(CacheBreakpoint(len(getattr(self, "messages", ())) - 1, TTL_SECONDS["24h"]))
        return breakpoints

    @property
    def comparison_response_id(self) -> str | None:
        return self.prompt_cache_options.comparison_response_id if self.prompt_cache_options is not None else None

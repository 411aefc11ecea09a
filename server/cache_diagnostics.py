"""Why a prompt missed the cache that an earlier one filled: computed from the two token sequences.

Both APIs' diagnostics (Anthropic's `diagnostics.cache_miss_reason`, OpenAI's
`prompt_cache_diagnostics`) come from one `Diagnosis`: the first token where
this prompt leaves the earlier one, the block of this request that token lies
in, how many of the earlier prompt's tokens after it cannot be reused, and what
is to blame: the model, the cache key, the tools, the output format or the
system turn when they differ, else the input.
"""

import hashlib
import json
from dataclasses import dataclass, replace

from server.job import CacheBreakpoint, ChatJob
from server.prompt_ledger import PromptRecord, divergence
from server.prompts import RequestPrompts

_BLAME_ORDER = ("model", "cache_key", "tools", "output_format", "system")  # first that differs is named


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def prompt_parts(job: ChatJob, model: str, cache_key: str | None = None) -> dict:
    """What a miss may be blamed on, as digests."""
    system = [m.get("content") for m in job.messages if m.get("role") == "system"]
    return {"model": model, "cache_key": cache_key or "", "tools": _digest(job.tools),
            "output_format": _digest(job.output_format), "system": _digest(system)}


@dataclass(frozen=True)
class Diagnosis:
    cause: str  # "hit" | "not_found" | one of _BLAME_ORDER | "input"
    position: int | None = None  # first differing token of the prompt
    block: str | None = None  # the request's block that token lies in ("system", "messages[2]", ...)
    num_missed_tokens: int = 0  # of the earlier prompt, after the divergence
    num_reusable_tokens: int = 0  # of the earlier prompt, before it


def diagnose(previous: PromptRecord | None, prompts: RequestPrompts, job: ChatJob, prompt_ids: list[int],
             parts: dict, sources: list[str]) -> Diagnosis:
    """`sources[i]` names the request block job.messages[i] came from."""
    if previous is None:
        return Diagnosis("not_found")
    found = divergence(previous.token_ids, prompt_ids)
    if found is None:
        return Diagnosis("hit", num_reusable_tokens=len(previous.token_ids))
    cause = next((name for name in _BLAME_ORDER if previous.parts.get(name) != parts.get(name)), "input")
    return Diagnosis(cause, found.position, _block_at(prompts, job, prompt_ids, found.position, sources),
                     found.num_missed_tokens, found.position)


def _block_at(prompts: RequestPrompts, job: ChatJob, prompt_ids: list[int], position: int, sources: list[str]) -> str:
    """The first message whose rendered end lies past `position` (one render per message)."""
    ends = replace(job, cache_breakpoints=tuple(CacheBreakpoint(i, 0) for i in range(len(job.messages))))
    for (breakpoint, num_tokens) in prompts.breakpoint_lengths(ends, prompt_ids):
        if num_tokens > position:
            return sources[breakpoint.message_index]
    return "generation prompt"


_OPENAI_MISS_REASONS = {"model": "model_changed", "cache_key": "prompt_cache_key_changed", "tools": "tools_changed",
                        "output_format": "text_format_changed"}


def openai_diagnostics_body(diagnosis: Diagnosis) -> dict:
    """`prompt_cache_diagnostics`, as OpenAI shapes it (Chat Completions and Responses); the first
    differing block and token are this server's own."""
    if diagnosis.cause == "hit":
        return {"type": "cache_hit"}
    if diagnosis.cause == "not_found":
        return {"type": "comparison_response_not_found"}
    return {"type": "cache_miss", "reason": _OPENAI_MISS_REASONS.get(diagnosis.cause, "input_changed"),
            "cache_missed_tokens": diagnosis.num_missed_tokens,
            "comparison_reusable_tokens": diagnosis.num_reusable_tokens,
            "first_differing_block": diagnosis.block, "first_differing_token": diagnosis.position}

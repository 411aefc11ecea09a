"""One streamed chat completion against any OpenAI-compatible server, timed chunk by chunk.

A chunk counts as output when its delta carries content (text, reasoning text or tool-call
arguments): TTFT ends at the first such chunk, ITL is the gap between consecutive ones.
Token counts come from the usage chunk (`stream_options.include_usage`); the cached share
from `usage.prompt_tokens_details.cached_tokens`, else llama-server's `timings.cache_n`.
Every failure (HTTP status, connection, timeout, an error event, a malformed stream)
becomes a RequestOutcome with `error` set; this function never raises for the server's sake.
"""

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.metrics import RequestOutcome
from bench.workload import ChatRequest

MAX_ERROR_CHARS = 200


@dataclass(frozen=True)
class StreamedReply:
    outcome: RequestOutcome
    text: str  # the reply's content, fed back into multi-turn sessions


def request_body(request: ChatRequest, model: str, ignore_eos: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model, "messages": list(request.messages), "max_tokens": request.max_tokens,
        "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
    }
    if ignore_eos:  # an extension vLLM, llama-server and radixserve honour; others ignore it
        body["ignore_eos"] = True
    if request.tools:
        body["tools"] = list(request.tools)
    if request.extra_body:
        body.update(request.extra_body)
    return body


def _delta_text(chunk: dict[str, Any]) -> str:
    parts = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        parts.append(delta.get("content") or "")
        parts.append(delta.get("reasoning_content") or "")
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            parts.append((function.get("name") or "") + (function.get("arguments") or ""))
    return "".join(parts)


def _cached_tokens(chunk: dict[str, Any]) -> int | None:
    details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        return int(details["cached_tokens"])
    timings = chunk.get("timings") or {}
    return int(timings["cache_n"]) if timings.get("cache_n") is not None else None


class _ServerError(Exception):
    """An error event inside a stream that had started with HTTP 200."""


class _Stream:
    """Accumulates one stream's chunks into timings, text and usage."""

    def __init__(self):
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.itl_s: list[float] = []
        self.text_parts: list[str] = []
        self.num_chunks_with_text = 0
        self.num_prompt_tokens = 0
        self.num_output_tokens: int | None = None
        self.num_cached_tokens: int | None = None

    def add(self, chunk: dict[str, Any], now_s: float) -> None:
        if "error" in chunk:
            raise _ServerError(str(chunk["error"].get("message", chunk["error"])
                                   if isinstance(chunk["error"], dict) else chunk["error"]))
        text = _delta_text(chunk)
        if text:
            if self.first_s is None:
                self.first_s = now_s
            else:
                self.itl_s.append(now_s - self.last_s)
            self.last_s = now_s
            self.text_parts.append(text)
            self.num_chunks_with_text += 1
        if chunk.get("usage"):
            self.num_prompt_tokens = int(chunk["usage"].get("prompt_tokens") or 0)
            self.num_output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
        cached = _cached_tokens(chunk)
        if cached is not None:
            self.num_cached_tokens = cached


async def stream_chat(client: httpx.AsyncClient, request: ChatRequest, *, model: str, ignore_eos: bool,
                      session_index: int, turn_index: int, run_started_s: float) -> StreamedReply:
    """POST /v1/chat/completions streamed; `client` carries the base URL, headers and timeout."""
    started_s = time.perf_counter()
    stream = _Stream()

    def failed(error: str) -> StreamedReply:
        return StreamedReply(RequestOutcome(session_index, turn_index, 0, 0, None, 0.0, 0.0, (),
                                            started_s - run_started_s, error[:MAX_ERROR_CHARS]), "")

    try:
        async with client.stream("POST", "/v1/chat/completions",
                                 json=request_body(request, model, ignore_eos)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                return failed(f"HTTP {response.status_code}: {' '.join(body.split())}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                stream.add(json.loads(data), time.perf_counter())
    except httpx.TimeoutException as error:
        return failed(f"timeout: {type(error).__name__}")
    except httpx.HTTPError as error:
        return failed(f"{type(error).__name__}: {error}")
    except _ServerError as error:
        return failed(f"error event: {error}")
    except json.JSONDecodeError as error:
        return failed(f"malformed stream chunk: {error}")
    ended_s = time.perf_counter()
    if stream.first_s is None:
        return failed("the stream carried no output")
    num_output_tokens = stream.num_output_tokens
    if num_output_tokens is None:  # no usage chunk: one token per chunk is the best guess
        num_output_tokens = stream.num_chunks_with_text
    outcome = RequestOutcome(session_index, turn_index, stream.num_prompt_tokens, num_output_tokens,
                             stream.num_cached_tokens, stream.first_s - started_s, ended_s - started_s,
                             tuple(stream.itl_s), started_s - run_started_s)
    return StreamedReply(outcome, "".join(stream.text_parts))

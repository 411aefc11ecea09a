"""Response bodies and stream chunks in OpenAI's exact shapes.

Chat:        object "chat.completion" / "chat.completion.chunk", ids "chatcmpl-..."
Completions: object "text_completion" (both), ids "cmpl-..."
Every response carries `usage` with `prompt_tokens_details.cached_tokens`.
"""

import time
import uuid
from dataclasses import dataclass

from server.completion_service import ChoiceDelta, ChoiceResult, Usage
from server.logprobs import LogprobFormatter


@dataclass(frozen=True)
class ResponseIdentity:
    """What every body and chunk of one response repeats."""

    id: str
    created: int  # unix seconds
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> "ResponseIdentity":
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model)


def usage_body(usage: Usage) -> dict:
    num_completion = usage.num_completion_tokens
    return {
        "prompt_tokens": usage.num_prompt_tokens,
        "completion_tokens": num_completion,
        "total_tokens": usage.num_prompt_tokens + num_completion,
        # reused_document_tokens (extension): of cached_tokens, those placed from the document store
        "prompt_tokens_details": {"cached_tokens": usage.num_cached_tokens,
                                  "reused_document_tokens": usage.num_reused_document_tokens},
    }


def _message(result: ChoiceResult) -> dict:
    message = {"role": "assistant", "content": result.content}
    if result.tool_calls:
        message["tool_calls"] = [call.to_openai() for call in result.tool_calls]
    return message


class ChatShapes:
    """Bodies of /v1/chat/completions."""

    def __init__(self, identity: ResponseIdentity, logprobs: LogprobFormatter, include_usage: bool = False,
                 extra_fields: dict | None = None, running_usage: Usage | None = None):
        self.identity = identity
        self._logprobs = logprobs
        self._include_usage = include_usage  # streams: `usage: null` on every chunk, then a usage chunk
        # vLLM's continuous_usage_stats: the usage so far (filled in as outputs arrive) on every chunk instead
        self._running_usage = running_usage
        self._extra_fields = extra_fields or {}  # extensions (retrieved_documents): the body, and a stream's first chunk

    def _logprobs_body(self, token_ids, logprobs, top_logprobs) -> dict | None:
        return None if logprobs is None else self._logprobs.chat(token_ids, logprobs, top_logprobs)

    def completion(self, results: list[ChoiceResult], usage: Usage) -> dict:
        return {
            "id": self.identity.id,
            "object": "chat.completion",
            "created": self.identity.created,
            "model": self.identity.model,
            "choices": [
                {
                    "index": r.index,
                    "message": _message(r),
                    "logprobs": self._logprobs_body(r.token_ids, r.logprobs, r.top_logprobs),
                    "finish_reason": r.finish_reason,
                }
                for r in results
            ],
            "usage": usage_body(usage),
            **self._extra_fields,
        }

    def _chunk(self, choices: list[dict]) -> dict:
        chunk = {"id": self.identity.id, "object": "chat.completion.chunk", "created": self.identity.created,
                 "model": self.identity.model, "choices": choices}
        if self._include_usage:
            chunk["usage"] = None if self._running_usage is None else usage_body(self._running_usage)
        return chunk

    def role_chunk(self, index: int) -> dict:
        chunk = self._chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])
        return {**chunk, **self._extra_fields} if index == 0 else chunk

    def content_chunk(self, delta: ChoiceDelta) -> dict:
        body = {"content": delta.text} if delta.text or not delta.tool_calls else {}
        if delta.tool_calls:
            body["tool_calls"] = [call.to_openai() for call in delta.tool_calls]
        return self._chunk([{"index": delta.index, "delta": body,
                             "logprobs": self._logprobs_body(delta.token_ids, delta.logprobs, delta.top_logprobs),
                             "finish_reason": None}])

    def finish_chunk(self, index: int, finish_reason: str) -> dict:
        return self._chunk([{"index": index, "delta": {}, "logprobs": None, "finish_reason": finish_reason}])

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.identity.id, "object": "chat.completion.chunk", "created": self.identity.created,
                "model": self.identity.model, "choices": [], "usage": usage_body(usage)}


class CompletionShapes:
    """Bodies of /v1/completions."""

    def __init__(self, identity: ResponseIdentity, logprobs: LogprobFormatter, include_usage: bool = False,
                 running_usage: Usage | None = None):
        self.identity = identity
        self._logprobs = logprobs
        self._include_usage = include_usage
        self._running_usage = running_usage  # as ChatShapes'
        self._text_offsets: dict[int, int] = {}  # per choice, for streamed logprobs' text_offset

    def _logprobs_body(self, index, text, token_ids, logprobs, top_logprobs) -> dict | None:
        if logprobs is None:
            return None
        offset = self._text_offsets.get(index, 0)
        self._text_offsets[index] = offset + len(text)
        return self._logprobs.completion(token_ids, logprobs, top_logprobs, offset)

    def completion(self, results: list[ChoiceResult], usage: Usage) -> dict:
        return {
            "id": self.identity.id,
            "object": "text_completion",
            "created": self.identity.created,
            "model": self.identity.model,
            "choices": [
                {
                    "index": r.index,
                    "text": r.text,
                    "logprobs": self._logprobs_body(r.index, r.text, r.token_ids, r.logprobs, r.top_logprobs),
                    "finish_reason": r.finish_reason,
                }
                for r in results
            ],
            "usage": usage_body(usage),
        }

    def _chunk(self, choice: dict) -> dict:
        chunk = {"id": self.identity.id, "object": "text_completion", "created": self.identity.created,
                 "model": self.identity.model, "choices": [choice]}
        if self._include_usage:
            chunk["usage"] = None if self._running_usage is None else usage_body(self._running_usage)
        return chunk

    def role_chunk(self, index: int) -> None:
        return None  # completions have no role chunk

    def content_chunk(self, delta: ChoiceDelta) -> dict:
        return self._chunk({"index": delta.index, "text": delta.text,
                            "logprobs": self._logprobs_body(delta.index, delta.text, delta.token_ids,
                                                            delta.logprobs, delta.top_logprobs),
                            "finish_reason": None})

    def finish_chunk(self, index: int, finish_reason: str) -> dict:
        return self._chunk({"index": index, "text": "", "logprobs": None, "finish_reason": finish_reason})

    def usage_chunk(self, usage: Usage) -> dict:
        return {"id": self.identity.id, "object": "text_completion", "created": self.identity.created,
                "model": self.identity.model, "choices": [], "usage": usage_body(usage)}

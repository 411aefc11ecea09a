"""Recent chat requests by response id, and where each one's prompt tokens came from (the console's token bar).

`GET /v1/requests/{id}` (server/routes_console.py) reads a record: visible only to the API key that
made the request (on a server without keys, to every caller), held in memory, the oldest out first
past `max_count`. A record keeps the request's live `Usage`, which the engine's outputs fill
(server/choice_stream.py), so a request still running reads as `in_progress` and its counts so far.

The breakdown is the engine's own accounting, carried through, never counted again here:
    prompt_tokens = prefix_cache + disk_tier + document_store + boundary_recompute + computed
where cached_tokens (the API's `prompt_tokens_details.cached_tokens`) = prefix_cache + disk_tier
+ document_store, document_store = `reused_document_tokens`, disk_tier = the pages the disk tier
loaded for this request, boundary_recompute = tokens of reused document spans computed after all.
"""

import time
from collections import OrderedDict
from dataclasses import dataclass

from server.choice_stream import Usage

DEFAULT_MAX_COUNT = 1024


@dataclass(frozen=True)
class RequestRecord:
    response_id: str
    key_id: str  # whose it is (server/auth.py's Caller.key_id)
    created: int  # unix seconds
    started: float  # time.perf_counter() when the route took it
    usage: Usage  # filled as the engine's outputs arrive
    num_choices: int
    document_reuse: bool  # the prompt held documents and reuse was on for it: the store could supply them


class RequestRecords:
    def __init__(self, max_count: int = DEFAULT_MAX_COUNT):
        if max_count < 1:
            raise ValueError(f"max count must be >= 1, got {max_count}")
        self.max_count = max_count
        self._records: OrderedDict[str, RequestRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def record(self, response_id: str, key_id: str, usage: Usage, num_choices: int, document_reuse: bool,
               started: float) -> None:
        """`started`: time.perf_counter() when the route took the request (TTFT counts from there)."""
        self._records[response_id] = RequestRecord(response_id, key_id, int(time.time()), started, usage,
                                                   num_choices, document_reuse)
        while len(self._records) > self.max_count:
            self._records.popitem(last=False)

    def lookup(self, response_id: str, key_id: str) -> RequestRecord | None:
        """None when unknown, forgotten, or another key's (the caller cannot tell which)."""
        record = self._records.get(response_id)
        return record if record is not None and record.key_id == key_id else None


def request_body(record: RequestRecord) -> dict:
    """`GET /v1/requests/{id}`: the prompt's tokens by origin, latency and speculation."""
    usage = record.usage
    num_prompt = usage.num_prompt_tokens
    num_documents = usage.num_reused_document_tokens
    num_disk = usage.num_disk_tier_tokens
    num_prefix = usage.num_cached_tokens - num_documents - num_disk
    num_recomputed = usage.num_recomputed_document_tokens
    num_drafts = sum(drafted for drafted, _ in usage.draft_tokens_by_choice.values())
    num_accepted = sum(accepted for _, accepted in usage.draft_tokens_by_choice.values())
    num_output = usage.num_completion_tokens_by_choice.get(0, 0)
    ttft = None if usage.first_token_time is None else usage.first_token_time - record.started
    tpot = None
    if num_output > 1 and usage.last_token_time is not None:
        tpot = (usage.last_token_time - usage.first_token_time) / (num_output - 1)
    return {
        "id": record.response_id,
        "object": "request",
        "created": record.created,
        "status": "completed" if usage.finish_reason is not None else "in_progress",
        "finish_reason": usage.finish_reason,
        "usage": {"prompt_tokens": num_prompt, "completion_tokens": usage.num_completion_tokens,
                  "cached_tokens": usage.num_cached_tokens, "reused_document_tokens": num_documents},
        # in the order the bar draws them; they sum to prompt_tokens
        "prompt_token_sources": {
            "prefix_cache": num_prefix,
            "disk_tier": num_disk,
            "document_store": num_documents,
            "boundary_recompute": num_recomputed,
            "computed": num_prompt - usage.num_cached_tokens - num_recomputed,
        },
        "document_reuse": record.document_reuse,
        "timings": {"ttft_seconds": _rounded(ttft), "tpot_seconds": _rounded(tpot)},
        "speculation": {"draft_tokens": num_drafts, "accepted_tokens": num_accepted,
                        "acceptance_rate": round(num_accepted / num_drafts, 4) if num_drafts else None},
    }


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)

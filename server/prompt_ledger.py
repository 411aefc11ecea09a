"""Recent prompts by response id, for prompt-cache diagnostics (where did this prompt leave that one's?).

Anthropic's `diagnostics.previous_message_id` and OpenAI's
`prompt_cache_options.comparison_response_id` name an earlier response; its
prompt's token ids are compared with this one's. Kept in memory, visible only
to the caller (key and salt) that made them, bounded by the tokens held (4
bytes each), least recently used out first. Stored Responses keep their own
ids in the response store instead.
"""

from array import array
from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_MAX_TOKENS = 4 << 20  # 16 MiB of token ids


@dataclass(frozen=True)
class PromptRecord:
    owner: str
    token_ids: array  # the prompt's ids
    parts: dict  # digests of what a miss is blamed on: {"model": ..., "system": ..., "tools": ...}


@dataclass(frozen=True)
class Divergence:
    position: int  # first token where the prompts differ
    num_missed_tokens: int  # tokens of the earlier prompt after it: cached there, not reusable here


def divergence(previous_ids, current_ids) -> Divergence | None:
    """None when the earlier prompt is a prefix of this one (all of it reusable)."""
    n = min(len(previous_ids), len(current_ids))
    position = next((i for i in range(n) if previous_ids[i] != current_ids[i]), n)
    if position == len(previous_ids):
        return None
    return Divergence(position, len(previous_ids) - position)


class PromptLedger:
    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS):
        self.max_tokens = max_tokens
        self._records: OrderedDict[str, PromptRecord] = OrderedDict()
        self.num_tokens = 0

    def record(self, response_id: str, owner: str, token_ids: list[int], parts: dict) -> None:
        record = PromptRecord(owner, array("I", token_ids), parts)
        self._records[response_id] = record
        self.num_tokens += len(record.token_ids)
        while self.num_tokens > self.max_tokens and self._records:
            self.num_tokens -= len(self._records.popitem(last=False)[1].token_ids)

    def lookup(self, response_id: str, owner: str) -> PromptRecord | None:
        record = self._records.get(response_id)
        if record is None or record.owner != owner:
            return None
        self._records.move_to_end(response_id)
        return record

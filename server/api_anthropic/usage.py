"""Anthropic's `usage` of a message, from what the engine did.

`cache_read_input_tokens` are the prompt tokens whose KV was read, not computed:
from the prefix cache and, with document reuse, from the document store (as
Anthropic's: read from a cache instead of processed). A cache breakpoint's prefix
is billed as a whole, as Anthropic bills it: read if the cache held it, created
if this request computed it. The tree keeps full KV pages, so "held" means every
full page of the prefix was read; the tail of its last partial page is always
computed again, and still counts as read. A breakpoint shorter than one page can
never be cached: it is neither read nor created (Anthropic's minimum cacheable
length plays that part there). `cache_creation_input_tokens` are the tokens from
the end of what was read to the end of the longest breakpoint, split in
`cache_creation` by the TTL of the breakpoint that ends each stretch;
`input_tokens` the rest, so the three add up to the prompt. Anthropic's usage has
no field for the document share; the OpenAI APIs' `reused_document_tokens` gives it.
"""

from server.choice_stream import Usage
from server.job import TTL_SECONDS, GenerationJob

_ONE_HOUR = TTL_SECONDS["1h"]


def usage_body(usage: Usage, job: GenerationJob, page_size: int) -> dict:
    num_prompt = usage.num_prompt_tokens
    pins = sorted((min(pin.num_tokens, num_prompt), pin.ttl_seconds or pin.seconds) for pin in job.pins)
    num_read = usage.num_cached_tokens
    for num_tokens, _ in pins:
        num_full_page_tokens = num_tokens - num_tokens % page_size
        if num_full_page_tokens > 0 and usage.num_cached_tokens >= num_full_page_tokens:
            num_read = max(num_read, num_tokens)
    created = {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}
    stretch_start = num_read
    for num_tokens, ttl_seconds in pins:
        if num_tokens >= page_size and num_tokens > stretch_start:
            bucket = "ephemeral_1h_input_tokens" if ttl_seconds >= _ONE_HOUR else "ephemeral_5m_input_tokens"
            created[bucket] += num_tokens - stretch_start
            stretch_start = num_tokens
    num_created = sum(created.values())
    return {"input_tokens": num_prompt - num_read - num_created,
            "cache_creation_input_tokens": num_created,
            "cache_read_input_tokens": num_read,
            "cache_creation": created,
            "output_tokens": usage.num_completion_tokens}

"""A validated request's sampling fields -> the engine's SamplingParams.

Fields the client left out take the server's defaults (server/generation_defaults.py:
flag, model, built-in), applied by `with_defaults`; the rest keep SamplingParams'. The
engine validates again and raises RequestError, which answers 400.
"""

from dataclasses import replace

from engine.sampling_params import SamplingParams
from server.generation_defaults import GenerationDefaults
from server.schemas import ChatCompletionRequest, CompletionRequest

# The penalties among the defaults: chosen so that sampled answers end (docs/performance.md), they stay off
# for a greedy request (temperature 0), which asks for the model's own argmax; its own penalties still apply.
_SAMPLED_ONLY_DEFAULTS = ("presence_penalty", "frequency_penalty", "repetition_penalty")
_OPTIONAL_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                    "repetition_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "seed")


def sampling_fields(request: ChatCompletionRequest | CompletionRequest) -> dict:
    """The SamplingParams fields a request sets, max_tokens aside."""
    fields = {name: value for name in _OPTIONAL_FIELDS if (value := getattr(request, name)) is not None}
    if request.logit_bias:
        fields["logit_bias"] = {int(token_id): bias for token_id, bias in request.logit_bias.items()}
    if request.stop_token_ids:
        fields["stop_token_ids"] = tuple(request.stop_token_ids)
    if getattr(request, "echo", False) and request.num_top_logprobs is not None:
        fields["prompt_logprobs"] = request.num_top_logprobs  # the echoed prompt's logprobs
    return {**fields, "ignore_eos": request.ignore_eos, "logprobs": request.num_top_logprobs}


def with_defaults(fields: dict, max_new_tokens: int | None, defaults: GenerationDefaults,
                  num_tokens_left: int) -> SamplingParams:
    """SamplingParams from a request's own `fields` (they win) over `defaults` (every field set; a greedy
    request takes no default penalty). A request
    without max tokens gets the default cap, cut to the `num_tokens_left` of its context (at least 1); its own
    max tokens is not cut: one that does not fit is the engine's to refuse."""
    if max_new_tokens is None:
        max_new_tokens = max(1, min(defaults.max_tokens, num_tokens_left))
    merged = {**defaults.sampling_fields(), **fields}
    if merged.get("temperature") == 0:
        merged = {name: value for name, value in merged.items() if name not in _SAMPLED_ONLY_DEFAULTS or name in fields}
    return SamplingParams(max_tokens=max_new_tokens, **merged)


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice `index` of n: a seeded request gives each choice its own (still reproducible) seed,
    so n > 1 choices differ as they would without a seed. Prompt logprobs are computed once,
    by choice 0 (they are the same for every choice)."""
    if index == 0:
        return params
    if params.prompt_logprobs is not None:
        params = replace(params, prompt_logprobs=None)
    if params.seed is None:
        return params
    return replace(params, seed=(params.seed + index) % 2**63)

"""Per-request sampling parameters, validated once when the request is made.

Ranges follow the OpenAI API where it has the field; ``top_k``, ``min_p`` and
``repetition_penalty`` follow vLLM, the ``dry_*`` fields llama.cpp's server
(engine/dry_penalty.py). Every bad value raises ``RequestError``
naming the field and its allowed range, so the server can answer 400.
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from engine.errors import RequestError

if TYPE_CHECKING:  # not imported at run time: server/generation_defaults.py checks its values here for --help
    from torch import Tensor

# (generated token ids so far, logits (V,) float32) -> logits (V,). Used for
# grammar token masks. Must not modify the token list; may modify the logits
# in place and return them.
LogitsProcessor = Callable[[list[int], "Tensor"], "Tensor"]


@runtime_checkable
class DraftingLogitsProcessor(Protocol):
    """A logits processor that also vouches for speculative drafts (a grammar's token mask):
    engine/draft_proposer.py drafts the tokens it forces, and only drafts it admits. Neither
    call changes what the processor masks later. Both take the generated ids so far."""

    def forced_tokens(self, token_ids: list[int]) -> list[int]:
        """Tokens for the only text it admits next (possibly none). The model may spell that text in
        other tokens the mask also allows: verification decides, as for any draft."""

    def num_admitted(self, token_ids: list[int], draft_ids: list[int]) -> int:
        """How many of draft_ids, from the first, may follow token_ids."""


MAX_TEMPERATURE = 2.0
MAX_ABS_PENALTY = 2.0          # presence / frequency, as OpenAI
MAX_ABS_LOGIT_BIAS = 100.0     # as OpenAI
MAX_DRY_MULTIPLIER = 10.0      # DRY's penalty at the allowed length; past a few it bans every repeat
MAX_DRY_BASE = 8.0
MAX_LOGPROBS = 20              # top alternatives a request may ask for
GREEDY_TEMPERATURE = 1e-5      # at or below this, sampling is argmax (as vLLM)
_SEED_RANGE = (-(2**63), 2**64 - 1)   # what torch.Generator.manual_seed accepts


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _check_number(name: str, value, low: float, high: float,
                  low_open: bool = False) -> None:
    """Raise unless ``value`` is a finite number in [low, high] (or (low, high])."""
    ok = _is_number(value) and value <= high and (value > low if low_open else value >= low)
    if not ok:
        bracket = "(" if low_open else "["
        raise RequestError(f"{name} must be a number in {bracket}{low:g}, {high:g}], got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0         # 0 -> greedy
    top_p: float = 1.0
    top_k: int = -1                  # -1 or 0 -> disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0    # OpenAI semantics, over generated tokens
    frequency_penalty: float = 0.0   # OpenAI semantics, over generated tokens
    repetition_penalty: float = 1.0  # HF/vLLM semantics, over prompt + generated tokens
    dry_multiplier: float = 0.0      # DRY (llama.cpp's), over generated tokens; 0: off
    dry_base: float = 1.75           # DRY's growth per repeated token past the allowed length
    dry_allowed_length: int = 2      # repeats up to this many tokens are not penalised
    logit_bias: Mapping[int, float] | None = None  # token id -> bias added to logits
    seed: int | None = None          # same seed -> same tokens, whatever the batch
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None      # None: none; k >= 0: chosen token + top-k alternatives
    # None: none; k >= 0: each prompt token's logprob + top-k alternatives, on the first output.
    # The prompt is then computed without the prefix cache (cached tokens have no logits).
    prompt_logprobs: int | None = None
    logits_processors: tuple[LogitsProcessor, ...] = ()

    def __post_init__(self):
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        _check_number("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        _check_number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if not _is_int(self.top_k) or self.top_k < -1:
            raise RequestError(f"top_k must be -1 (disabled), 0 (disabled) or an integer >= 1, "
                               f"got {self.top_k!r}")
        _check_number("min_p", self.min_p, 0.0, 1.0)
        _check_number("presence_penalty", self.presence_penalty, -MAX_ABS_PENALTY, MAX_ABS_PENALTY)
        _check_number("frequency_penalty", self.frequency_penalty,
                      -MAX_ABS_PENALTY, MAX_ABS_PENALTY)
        if not _is_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise RequestError(f"repetition_penalty must be a number > 0, "
                               f"got {self.repetition_penalty!r}")
        _check_number("dry_multiplier", self.dry_multiplier, 0.0, MAX_DRY_MULTIPLIER)
        _check_number("dry_base", self.dry_base, 1.0, MAX_DRY_BASE, low_open=True)
        if not _is_int(self.dry_allowed_length) or self.dry_allowed_length < 1:
            raise RequestError(f"dry_allowed_length must be an integer >= 1, got {self.dry_allowed_length!r}")
        self._check_logit_bias()
        if self.seed is not None and not (_is_int(self.seed)
                                          and _SEED_RANGE[0] <= self.seed <= _SEED_RANGE[1]):
            raise RequestError(f"seed must be an integer in [-2**63, 2**64 - 1] or null, "
                               f"got {self.seed!r}")
        stop_token_ids = tuple(self.stop_token_ids)
        if not all(_is_int(t) and t >= 0 for t in stop_token_ids):
            raise RequestError(f"stop_token_ids must be integers >= 0, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            raise RequestError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        if self.logprobs is not None and not (_is_int(self.logprobs)
                                              and 0 <= self.logprobs <= MAX_LOGPROBS):
            raise RequestError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] or null, "
                               f"got {self.logprobs!r}")
        if self.prompt_logprobs is not None and not (_is_int(self.prompt_logprobs)
                                                     and 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            raise RequestError(f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}] or null, "
                               f"got {self.prompt_logprobs!r}")
        processors = tuple(self.logits_processors)
        if not all(callable(p) for p in processors):
            raise RequestError("logits_processors must be callables "
                               "(generated token ids, logits) -> logits")
        object.__setattr__(self, "logits_processors", processors)

    def _check_logit_bias(self) -> None:
        """Validate and freeze logit_bias into a read-only {int: float} map (empty -> None)."""
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, Mapping):
            raise RequestError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}")
        frozen = {}
        for token_id, bias in self.logit_bias.items():
            if isinstance(token_id, str) and token_id.strip().isdigit():
                token_id = int(token_id)    # JSON object keys arrive as strings
            if not _is_int(token_id) or token_id < 0:
                raise RequestError(f"logit_bias keys must be token ids >= 0, got {token_id!r}")
            _check_number(f"logit_bias[{token_id}]", bias, -MAX_ABS_LOGIT_BIAS, MAX_ABS_LOGIT_BIAS)
            frozen[token_id] = float(bias)
        object.__setattr__(self, "logit_bias", MappingProxyType(frozen) if frozen else None)

    def check_vocab_size(self, vocab_size: int) -> None:
        """Raise RequestError if a token id named here is outside the model's vocabulary.

        Called by the engine when it admits the request (the params alone do
        not know the model).
        """
        for name, token_ids in (("logit_bias", self.logit_bias or ()),
                                ("stop_token_ids", self.stop_token_ids)):
            bad = [t for t in token_ids if t >= vocab_size]
            if bad:
                raise RequestError(f"{name} names token id {bad[0]}, "
                                   f"but the vocabulary has {vocab_size} tokens")

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0 or self.dry_multiplier != 0.0)

    @property
    def has_top_k(self) -> bool:
        return self.top_k > 0

    @property
    def has_top_p(self) -> bool:
        return self.top_p < 1.0

    @property
    def has_min_p(self) -> bool:
        return self.min_p > 0.0

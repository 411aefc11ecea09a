"""Per-request timings and their summary, with the definitions of vLLM's `bench serve`.

- TTFT: request sent -> first streamed content chunk.
- TPOT: (e2e - TTFT) / (output_tokens - 1), per request that produced at least 2 tokens.
- ITL: each gap between consecutive content chunks, pooled over all requests.
- E2E latency: request sent -> stream closed.
- Throughputs divide totals of successful requests by the run's wall time.
- Cached share: sum(cached prompt tokens) / sum(prompt tokens), over the requests whose server
  reported cached tokens (None when none did).
- Prompt tokens computed: sum(prompt tokens - cached prompt tokens) over the same requests: the
  prefill the server did (None when none reported cached tokens).
Percentiles interpolate linearly between order statistics (numpy's default, as vLLM).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestOutcome:
    """One request's measurements. Failed requests keep `error` and zero timings."""

    session_index: int
    turn_index: int  # 0 for single-turn workloads
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int | None  # None: the server did not report it
    ttft_s: float
    e2e_s: float
    itl_s: tuple[float, ...]
    start_s: float  # since the run began
    error: str | None = None

    @property
    def is_success(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        if self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)


@dataclass(frozen=True)
class Stats:
    """mean / median / p99 of one metric, in milliseconds (0 when there are no samples, as vLLM)."""

    mean_ms: float
    median_ms: float
    p99_ms: float

    @classmethod
    def of_seconds(cls, values_s: Sequence[float]) -> "Stats":
        if len(values_s) == 0:
            return cls(0.0, 0.0, 0.0)
        values_ms = np.asarray(values_s, dtype=np.float64) * 1000.0
        return cls(float(values_ms.mean()), float(np.median(values_ms)), float(np.percentile(values_ms, 99)))


@dataclass(frozen=True)
class BenchSummary:
    num_completed: int
    num_failed: int
    duration_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    request_throughput: float  # requests / s
    output_throughput: float  # output tokens / s
    total_token_throughput: float  # (prompt + output) tokens / s
    cached_share: float | None
    num_computed_prompt_tokens: int | None
    ttft: Stats
    tpot: Stats
    itl: Stats
    e2e: Stats
    first_errors: tuple[str, ...]  # a few distinct error messages, for the report


NUM_ERRORS_KEPT = 3


def summarize(outcomes: Sequence[RequestOutcome], duration_s: float) -> BenchSummary:
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    ok = [o for o in outcomes if o.is_success]
    failed = [o for o in outcomes if not o.is_success]
    num_prompt_tokens = sum(o.num_prompt_tokens for o in ok)
    num_output_tokens = sum(o.num_output_tokens for o in ok)
    reporting = [o for o in ok if o.num_cached_tokens is not None]
    reported_prompt_tokens = sum(o.num_prompt_tokens for o in reporting)
    cached_share = (sum(o.num_cached_tokens for o in reporting) / reported_prompt_tokens
                    if reported_prompt_tokens else None)
    errors = tuple(dict.fromkeys(o.error for o in failed))[:NUM_ERRORS_KEPT]
    return BenchSummary(
        num_completed=len(ok),
        num_failed=len(failed),
        duration_s=duration_s,
        num_prompt_tokens=num_prompt_tokens,
        num_output_tokens=num_output_tokens,
        request_throughput=len(ok) / duration_s,
        output_throughput=num_output_tokens / duration_s,
        total_token_throughput=(num_prompt_tokens + num_output_tokens) / duration_s,
        cached_share=cached_share,
        num_computed_prompt_tokens=(reported_prompt_tokens - sum(o.num_cached_tokens for o in reporting)
                                    if reporting else None),
        ttft=Stats.of_seconds([o.ttft_s for o in ok]),
        tpot=Stats.of_seconds([t for o in ok if (t := o.tpot_s) is not None]),
        itl=Stats.of_seconds([gap for o in ok for gap in o.itl_s]),
        e2e=Stats.of_seconds([o.e2e_s for o in ok]),
        first_errors=errors,
    )


def median_ttft_by_turn_s(outcomes: Sequence[RequestOutcome]) -> dict[int, float]:
    """Median TTFT of the successful requests at each turn index (the agent plot)."""
    by_turn: dict[int, list[float]] = {}
    for o in outcomes:
        if o.is_success:
            by_turn.setdefault(o.turn_index, []).append(o.ttft_s)
    return {turn: float(np.median(ttfts)) for turn, ttfts in sorted(by_turn.items())}

"""Speculation's series (0 when off), as vLLM names them: drafts (a request's draft tokens verified in one
step, a verify chunk), their tokens, and the tokens accepted. The engine step counts them
(engine/llm_engine.py, on EngineMetrics); a new counter is a field here and the line that reads it."""

from dataclasses import dataclass
from typing import ClassVar

from engine.stats_table import StatsMetric, metric


@dataclass(frozen=True)
class SpeculationStats:
    num_draft_tokens: int = metric("spec_decode_num_draft_tokens", "counter", "Draft tokens verified.", default=0)
    num_accepted_tokens: int = metric("spec_decode_num_accepted_tokens", "counter", "Draft tokens accepted.",
                                      default=0)
    num_verify_chunks: int = metric("spec_decode_num_drafts", "counter",
                                    "Drafts verified (one request's draft tokens in one step).", default=0)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verify chunk emits on average: 1 + accepted / verify chunks (0 before any)."""
        if self.num_verify_chunks == 0:
            return 0.0
        return 1 + self.num_accepted_tokens / self.num_verify_chunks

    DERIVED_METRICS: ClassVar[tuple[StatsMetric, ...]] = (
        StatsMetric("spec_decode_mean_acceptance_length", "gauge",
                    "Tokens a verified draft emitted on average (1 + accepted / drafts; 0 before any draft).",
                    lambda s: s.mean_acceptance_length),
    )


def speculation_stats(metrics) -> SpeculationStats:
    """`metrics`: the engine's EngineMetrics, where the step counts drafts."""
    return SpeculationStats(num_draft_tokens=metrics.num_draft_tokens,
                            num_accepted_tokens=metrics.num_accepted_draft_tokens,
                            num_verify_chunks=metrics.num_verify_chunks)

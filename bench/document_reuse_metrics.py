"""How far reused-document logits are from exact ones: KL and top-1 agreement, row by row.

Rows are next-token logits, shape (num_rows, vocab_size); row i of the exact and of the reuse
tensor score the same position. KL(exact || reuse) = sum_x p(x) (log p(x) - log q(x)), in nats,
computed in float64 so that a difference of the last float32 bits reads as ~0, not as noise.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def row_kl(exact_logits: torch.Tensor, reuse_logits: torch.Tensor) -> torch.Tensor:
    """(num_rows,) float64: KL(softmax(exact) || softmax(reuse)) per row, >= 0."""
    if exact_logits.shape != reuse_logits.shape or exact_logits.dim() != 2:
        raise ValueError(f"need two (num_rows, vocab) tensors of one shape, got {tuple(exact_logits.shape)} "
                         f"and {tuple(reuse_logits.shape)}")
    log_p = torch.log_softmax(exact_logits.double(), dim=-1)
    log_q = torch.log_softmax(reuse_logits.double(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1).clamp_min(0.0)


def row_top1_agreement(exact_logits: torch.Tensor, reuse_logits: torch.Tensor) -> torch.Tensor:
    """(num_rows,) bool: the two rows' most likely tokens are the same."""
    return exact_logits.argmax(dim=-1) == reuse_logits.argmax(dim=-1)


@dataclass(frozen=True)
class PromptComparison:
    """One prompt, exact vs reuse: the first answer token and the teacher-forced answer."""

    first_token_kl: float
    is_first_token_same: bool
    answer_kls: tuple[float, ...]  # per teacher-forced answer token
    answer_agreements: tuple[bool, ...]


def compare_prompt(exact_rows: torch.Tensor, reuse_rows: torch.Tensor, num_answer_tokens: int) -> PromptComparison:
    """Rows from prompt_tail_logits(prompt + answer, len(answer) + 1): row 0 scores the first answer
    token (the first-token distribution), rows 0..len(answer)-1 the answer's tokens."""
    rows = slice(0, num_answer_tokens)
    kls = row_kl(exact_rows[rows], reuse_rows[rows])
    same = row_top1_agreement(exact_rows[rows], reuse_rows[rows])
    first_kl = float(row_kl(exact_rows[:1], reuse_rows[:1])[0])
    first_same = bool(row_top1_agreement(exact_rows[:1], reuse_rows[:1])[0])
    return PromptComparison(first_kl, first_same, tuple(float(x) for x in kls), tuple(bool(x) for x in same))


@dataclass(frozen=True)
class QualitySummary:
    num_prompts: int
    first_token_agreement: float  # share of prompts whose first answer token is the same
    first_token_kl_mean: float
    first_token_kl_p90: float
    answer_kl_mean: float  # over all teacher-forced answer tokens of all prompts
    answer_top1_agreement: float  # share of teacher-forced answer tokens with the same top-1


def summarize_quality(comparisons: Sequence[PromptComparison]) -> QualitySummary:
    if not comparisons:
        raise ValueError("no prompts to summarize")
    first_kls = torch.tensor([c.first_token_kl for c in comparisons], dtype=torch.float64)
    answer_kls = [kl for c in comparisons for kl in c.answer_kls]
    agreements = [a for c in comparisons for a in c.answer_agreements]
    return QualitySummary(
        num_prompts=len(comparisons),
        first_token_agreement=sum(c.is_first_token_same for c in comparisons) / len(comparisons),
        first_token_kl_mean=float(first_kls.mean()),
        first_token_kl_p90=float(torch.quantile(first_kls, 0.9)),
        answer_kl_mean=sum(answer_kls) / len(answer_kls) if answer_kls else 0.0,
        answer_top1_agreement=sum(agreements) / len(agreements) if agreements else 1.0,
    )

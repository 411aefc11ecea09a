"""The document-reuse quality bench's results: one row per variant, as JSON and as a markdown table.

The gates the default of `--document-reuse` is held to (issue 18): first-token agreement >= 0.90
and teacher-forced top-1 agreement >= 0.90, on all prompts.
"""

import dataclasses
import datetime
import json
import operator
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.document_reuse_metrics import PromptComparison, QualitySummary, summarize_quality

MIN_FIRST_TOKEN_AGREEMENT = 0.90
MIN_ANSWER_TOP1_AGREEMENT = 0.90
# the report's key -> EngineStats' field (the document reuse ones on its DocumentReuseStats)
STATS_KEPT = {"num_document_reused_spans": "documents.num_reused_spans",
              "num_document_reused_tokens": "documents.num_reused_tokens",
              "num_document_recomputed_tokens": "documents.num_recomputed_tokens",
              "num_document_store_bytes": "documents.num_store_bytes",
              "num_document_store_entries": "documents.num_store_entries",
              "num_prefix_hit_tokens": "num_prefix_hit_tokens",
              "num_document_selective_recomputed_tokens": "documents.num_selective_recomputed_tokens",
              "num_document_probe_tokens": "documents.num_probe_tokens"}


@dataclass(frozen=True)
class VariantResult:
    name: str
    boundary_tokens: int
    recompute_fraction: float
    is_precomputed: bool
    all: QualitySummary
    plain: QualitySummary | None  # prompts with documents pasted into a message
    documents: QualitySummary | None  # prompts with the `documents` field
    with_reuse: QualitySummary | None  # prompts that reused any document KV
    computed_tokens: tuple[int, ...]  # per prompt, prompt tokens computed (answer excluded)
    reused_tokens: tuple[int, ...]  # per prompt, prompt tokens whose KV came from the document store
    num_precomputed_tokens: int
    seconds: float
    engine_stats: dict[str, int]

    @classmethod
    def of(cls, variant, comparisons: Sequence[PromptComparison], computed_tokens: Sequence[int],
           reused_tokens: Sequence[int], num_precomputed_tokens: int, is_plain: Sequence[bool], seconds: float,
           stats) -> "VariantResult":
        def summary(keep: Sequence[bool]) -> QualitySummary | None:
            kept = [c for c, k in zip(comparisons, keep) if k]
            return summarize_quality(kept) if kept else None

        return cls(variant.name, variant.boundary_tokens, variant.recompute_fraction, variant.is_precomputed,
                   summarize_quality(comparisons), summary(is_plain), summary([not p for p in is_plain]),
                   summary([n > 0 for n in reused_tokens]), tuple(computed_tokens), tuple(reused_tokens),
                   num_precomputed_tokens, seconds,
                   {name: operator.attrgetter(path)(stats) for name, path in STATS_KEPT.items()
                    if _has_path(stats, path)})

    @property
    def passes_gates(self) -> bool:
        return (self.all.first_token_agreement >= MIN_FIRST_TOKEN_AGREEMENT
                and self.all.answer_top1_agreement >= MIN_ANSWER_TOP1_AGREEMENT)


@dataclass(frozen=True)
class QualityRun:
    args: dict[str, Any]
    model: str
    num_prompts: int
    mean_prompt_tokens: float
    num_pool_documents: int
    exact_seconds: float
    exact_computed_tokens: list[int]  # per prompt, with reuse off (the prefix cache on)
    exact_accuracy: float | None  # scored questions answered right by the exact greedy answer
    num_scored: int
    chance_accuracy: float
    mean_answer_tokens: float
    sample_answers: list[tuple[str, str]]  # (end of the question, exact answer)
    variants: list[VariantResult]
    notes: list[str]
    total_seconds: float


def computed_ratio(run: QualityRun, variant: VariantResult) -> float:
    """Prompt tokens computed with this variant / with reuse off (precomputed tokens not counted)."""
    return sum(variant.computed_tokens) / max(1, sum(run.exact_computed_tokens))


def _summary_cells(summary: QualitySummary | None) -> str:
    if summary is None:
        return "- | - | - | -"
    return (f"{summary.first_token_agreement:.3f} | {summary.first_token_kl_mean:.4f} "
            f"| {summary.answer_top1_agreement:.3f} | {summary.answer_kl_mean:.4f}")


def _pair(summary: QualitySummary | None) -> str:
    return "-" if summary is None else f"{summary.first_token_agreement:.3f} / {summary.answer_top1_agreement:.3f}"


def markdown(run: QualityRun) -> str:
    lines = [
        "# Document KV reuse: quality against exact prefill", "",
        f"{run.num_prompts} RAG prompts (mean {run.mean_prompt_tokens:.0f} tokens, "
        f"{run.args['documents_per_prompt']} of {run.num_pool_documents} passages each, shuffled; "
        "plain = pasted into the system or user message, documents = the `documents` field), "
        f"model `{Path(run.model).name}`. First token: agreement of the top-1 token and mean "
        "KL(exact || reuse) of the first answer token's distribution. Teacher-forced: the same over the "
        f"exact path's greedy answer (mean {run.mean_answer_tokens:.1f} of at most 16 tokens). Computed: prompt "
        "tokens computed / with reuse off (prefix cache on in both); reused share: prompt tokens whose KV came "
        "from the document store / all prompt tokens.", "",
        "| variant | first-token agree | first-token KL | TF top-1 agree | TF KL/token | computed / off "
        "| reused share | plain: first / TF agree | documents: first / TF agree "
        "| prompts with reuse: n, first / TF agree | gates | s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for v in run.variants:
        reused_share = sum(v.reused_tokens) / max(1.0, run.num_prompts * run.mean_prompt_tokens)
        lines.append(
            f"| {v.name} | {_summary_cells(v.all)} | {computed_ratio(run, v):.3f} | {reused_share:.3f} "
            f"| {_pair(v.plain)} | {_pair(v.documents)} "
            f"| {0 if v.with_reuse is None else v.with_reuse.num_prompts}, {_pair(v.with_reuse)} "
            f"| {'pass' if v.passes_gates else 'fail'} | {v.seconds:.0f} |")
    accuracy = ("-" if run.exact_accuracy is None else
                f"{run.exact_accuracy:.3f} on {run.num_scored} \"which document mentions X\" questions "
                f"(chance {run.chance_accuracy:.2f})")
    num_exact_computed = max(1, sum(run.exact_computed_tokens))
    probed = [f"{v.name}: {v.engine_stats.get('num_document_probe_tokens', 0) / num_exact_computed:.3f}"
              for v in run.variants if v.recompute_fraction > 0]
    if probed:
        lines += ["", "Selective recompute (r > 0): its recomputed tokens are in `computed / off`; the positions its "
                  "probe ran through the first 2 layers, / prompt tokens computed with reuse off: "
                  + "; ".join(probed) + "."]
    lines += ["", f"Gates for the default (issue 18): first-token agreement >= {MIN_FIRST_TOKEN_AGREEMENT} and "
              f"teacher-forced top-1 agreement >= {MIN_ANSWER_TOP1_AGREEMENT}.",
              f"Exact-path answer accuracy: {accuracy}.",
              f"Prompt tokens computed with reuse off: {sum(run.exact_computed_tokens)} "
              f"({run.exact_seconds:.0f} s for the exact pass). Whole run: {run.total_seconds:.0f} s.", ""]
    lines += ["Sample exact answers:", ""] + [f"- `…{q!r}` -> `{a!r}`" for q, a in run.sample_answers]
    lines += [""] + [f"- {note}" for note in run.notes]
    return "\n".join(lines) + "\n"


def write_quality_report(run: QualityRun, stem: Path) -> tuple[Path, Path]:
    """`stem`.json and `stem`.md (e.g. bench/results/<date>_document_reuse_quality)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    record = {"created": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": {"platform": platform.platform(), "num_cpus": os.cpu_count(),
                          "load_average_1m": os.getloadavg()[0]},
              **dataclasses.asdict(run),
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in run.args.items()},
              "computed_ratios": {v.name: computed_ratio(run, v) for v in run.variants}}
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    json_path.write_text(json.dumps(record, indent=1) + "\n")
    md_path.write_text(markdown(run))
    return json_path, md_path


def _has_path(value, path: str) -> bool:
    try:
        operator.attrgetter(path)(value)
    except AttributeError:
        return False
    return True

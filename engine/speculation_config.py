"""Draft-model-free speculative decoding's settings (engine/draft_proposer.py runs it)."""

from dataclasses import dataclass

from engine.setting import setting

SPECULATIVE_MODES = ("off", "ngram", "suffix")
DEFAULT_MAX_DRAFT_TOKENS = 7
DEFAULT_SUFFIX_INDEX_TOKENS = 200_000  # cross-request tokens kept (~2 MB of ids plus the index)


@dataclass(frozen=True)
class SpeculationConfig:
    mode: str = setting(
        "off", "draft-free speculative decoding: ngram (drafts from the request's own prompt and output), suffix "
        "(also from recent requests' prompts and outputs) or off; a request turns it off for itself with "
        "\"speculation\": false", flag="--speculative", choices=SPECULATIVE_MODES,
        # what bench/speculation_bench.py measured (docs/architecture.md, Speculation)
        serve_default="ngram")
    max_draft_tokens: int = setting(
        DEFAULT_MAX_DRAFT_TOKENS, "the most draft tokens a request verifies in one step (the backend's row costs "
        "pick how many, up to this)")
    suffix_index_tokens: int = setting(
        DEFAULT_SUFFIX_INDEX_TOKENS, "with --speculative suffix: recent tokens kept across requests to draft from")
    # None: the backend's (model/backends StepPolicy.max_verify_rows_per_step: 8 on the cpu backend, where more
    # rows leave the few-rows kernels)
    max_verify_rows_per_step: int | None = setting(
        None, "rows (decodes + drafts) a step may hold and still verify drafts (default: the backend's)", parse=int)

    def __post_init__(self):
        if self.mode not in SPECULATIVE_MODES:
            raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, got {self.mode!r}")
        if self.max_draft_tokens < 1:
            raise ValueError(f"max_draft_tokens must be >= 1, got {self.max_draft_tokens}")
        if self.max_verify_rows_per_step is not None and self.max_verify_rows_per_step < 1:
            raise ValueError(f"max_verify_rows_per_step must be >= 1, got {self.max_verify_rows_per_step}")
        if self.suffix_index_tokens < 1:
            raise ValueError(f"suffix_index_tokens must be >= 1, got {self.suffix_index_tokens}")

    @property
    def is_on(self) -> bool:
        return self.mode != "off"

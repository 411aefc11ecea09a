"""Quality of document KV reuse against exact prefill, in-process on the default model.

    .venv/bin/python -m bench.document_reuse_quality [--num-prompts 200] [--k-values 0,4,16,32]
        [--precomputed-k-values K,..] [--recompute-fractions 0.15] [--recompute-k-values K,..]
        [--quick] [--self-test] [--exact-cache FILE]

RAG prompts from real text (bench/document_reuse_prompts.py: 4 passages each, shuffled across
prompts; a third pasted into the system message, a third into the user message, a third sent as
`documents`), built into token ids by the server's own prompt builder (assembly/prompt_builder.py),
so span boundaries are the real ones; `documents` prompts carry their exact spans in
RequestOptions.document_spans, plain ones leave the engine to find spans.

Exact pass (reuse off, the prefix cache on as served): each prompt answered greedily (up to 16
tokens, EOS ends it), then prompt_tail_logits(prompt + answer, len(answer) + 1): row 0 is the
first-token distribution, rows 0..len(answer)-1 score the answer teacher-forced. Reuse pass, one
fresh engine per variant (k = document_boundary_tokens, r = document_recompute_fraction, the
CacheBlend-style selective recompute of engine/selective_recompute.py; "online":
the store filled by the earlier prompts, run in order; "precomputed": every pool passage stored
first with precompute_documents after the context a one-document prompt holds before it, as ingest
does; "precomputed alone": from position 0): the same prompt_tail_logits call. Reported
per variant: first-token agreement and KL(exact || reuse), the teacher-forced mean per-token KL and
top-1 agreement, and the prompt tokens computed against the exact pass's (selectively recomputed
tokens are computed; positions selective recompute probed through its first layers are reported apart). `--self-test` adds a
variant with reuse off on both sides: its agreement must be 1.0 and its KL ~0.
"""

import argparse
import datetime
import gc
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from assembly.chat_template import ChatTemplate
from assembly.document_ranges import document_token_ranges
from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import SegmentTokenizer
from assembly.tokenizer import Tokenizer
from bench.document_reuse_exact_cache import (ExactAnswer, current_commit, load_exact_answers,
                                              save_exact_answers)
from bench.document_reuse_metrics import PromptComparison, compare_prompt
from bench.document_reuse_prompts import PLAIN_STYLES, RagPrompt, answer_is_correct, rag_prompts
from bench.document_reuse_report import QualityRun, VariantResult, write_quality_report
from engine.document_reuse_config import DocumentReuseConfig
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.request_options import RequestOptions
from engine.sampling_params import SamplingParams
from server.document_precompute import precompute_token_ids
from store.model_store import pull

DEFAULT_MODEL = "smollm2-135m-instruct"
NUM_ANSWER_TOKENS = 16
KV_CACHE_BYTES = 768 << 20  # an exact window of prompts and their answers, with room to spare
DOCUMENT_STORE_BYTES = 768 << 20  # every pool passage fits: reuse is limited by the order, not the bound
EXACT_WINDOW = 8  # prompts answered together on the exact path (their decodes batched)
RESULTS_DIR = Path(__file__).with_name("results")


@dataclass(frozen=True)
class BuiltPrompt:
    prompt: RagPrompt
    token_ids: list[int]
    exact_spans: tuple[tuple[int, int], ...]  # token ranges of the `documents` texts; () for plain styles


@dataclass(frozen=True)
class Variant:
    name: str
    document_reuse: bool
    boundary_tokens: int = 0
    recompute_fraction: float = 0.0
    is_precomputed: bool = False
    precomputed_alone: bool = False  # each passage from position 0, without the context ingest gives it


def build_prompt(builder: PromptBuilder, prompt: RagPrompt) -> BuiltPrompt:
    """Token ids as the server builds them; for `documents`, each text's token range in them, found
    as the server finds it (assembly/document_ranges.py)."""
    documents = [dict(d) for d in prompt.documents] or None
    token_ids = builder.build(list(prompt.messages), documents=documents)
    if not prompt.documents:
        return BuiltPrompt(prompt, token_ids, ())
    spans = document_token_ranges(builder.tokenizer, token_ids, [d["text"] for d in prompt.documents])
    return BuiltPrompt(prompt, token_ids, tuple(spans))


def _options(built: BuiltPrompt, document_reuse: bool) -> RequestOptions:
    return RequestOptions(document_reuse=document_reuse, document_spans=built.exact_spans)


def _engine(model_dir: Path, variant: Variant) -> LLMEngine:
    documents = DocumentReuseConfig(enabled=variant.document_reuse, store_bytes=DOCUMENT_STORE_BYTES,
                                    boundary_tokens=variant.boundary_tokens,
                                    recompute_fraction=variant.recompute_fraction)
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=KV_CACHE_BYTES,
                                  documents=documents))


def _answer_window(engine: LLMEngine, window: Sequence[BuiltPrompt]) -> list[tuple[list[int], int]]:
    """Greedy answers of a window of prompts: (answer ids, prompt tokens computed) each. A prompt is
    admitted once the one before it has its first token, so its prefix match sees every earlier
    prompt (as if they ran one by one) while their decodes share steps with its prefill."""
    params = SamplingParams(max_tokens=NUM_ANSWER_TOKENS, temperature=0.0)
    requests, pending = [], list(window)
    while pending or engine.has_unfinished():
        if pending and (not requests or requests[-1].output_token_ids):
            built = pending.pop(0)
            requests.append(engine.add_request(f"exact-{built.prompt.index}", built.token_ids, params,
                                               options=_options(built, False)))
        engine.step()
    return [(list(r.output_token_ids), len(r.prompt_token_ids) - r.num_cached_tokens) for r in requests]


def exact_pass(engine: LLMEngine, prompts: Sequence[BuiltPrompt], tokenizer: Tokenizer) -> list[ExactAnswer]:
    """Answers window by window; then, on the idle engine, each prompt's tail logits (its prompt
    still in the prefix cache: only the answer is computed)."""
    answers = []
    for first in range(0, len(prompts), EXACT_WINDOW):
        window = prompts[first:first + EXACT_WINDOW]
        for built, (answer_ids, computed) in zip(window, _answer_window(engine, window)):
            rows = engine.prompt_tail_logits(built.token_ids + answer_ids, len(answer_ids) + 1,
                                             options=_options(built, False))
            answers.append(ExactAnswer(answer_ids, tokenizer.decode(answer_ids), rows.float().clone(), computed))
        _progress("exact", len(answers), len(prompts))
    return answers


def reuse_pass(engine: LLMEngine, variant: Variant, prompts: Sequence[BuiltPrompt], answers: Sequence[ExactAnswer],
               pool: tuple[list[list[int]], list[list[int]]]) -> tuple[list[PromptComparison], list[int], list[int], int]:
    """(comparison, prompt tokens computed, document tokens reused: per prompt; tokens precomputed).
    `pool`: (contexts, token ids) of the pool's passages, as ingest precomputes them."""
    contexts, pool_token_ids = pool
    num_precomputed = 0
    if variant.is_precomputed:
        num_precomputed = engine.precompute_documents([list(ids) for ids in pool_token_ids], None,
                                                      context_token_id_lists=None if variant.precomputed_alone
                                                      else [list(c) for c in contexts])
    comparisons, computed, reused = [], [], []
    for built, answer in zip(prompts, answers):
        computed_before, reused_before = engine.metrics.num_prefill_tokens, engine.stats().documents.num_reused_tokens
        rows = engine.prompt_tail_logits(built.token_ids + answer.answer_ids, len(answer.answer_ids) + 1,
                                         options=_options(built, variant.document_reuse))
        # The answer's tokens follow the last document: computed on every path, not the prompt's.
        computed.append(engine.metrics.num_prefill_tokens - computed_before - len(answer.answer_ids))
        reused.append(engine.stats().documents.num_reused_tokens - reused_before)
        comparisons.append(compare_prompt(answer.rows, rows.float(), len(answer.answer_ids)))
        _progress(variant.name, built.prompt.index + 1, len(prompts))
    return comparisons, computed, reused, num_precomputed


def _progress(name: str, done: int, total: int) -> None:
    if done == total or done % 40 == 0:
        print(f"  {name}: {done}/{total}", file=sys.stderr, flush=True)


def variants_for(k_values: Sequence[int], precomputed_k_values: Sequence[int], recompute_fractions: Sequence[float],
                 recompute_k_values: Sequence[int], self_test: bool,
                 precomputed_alone_k_values: Sequence[int] = ()) -> list[Variant]:
    """Online for each k; precomputed (in context, as ingest does) for each of its k, and alone for
    each of its own; each fraction > 0 at each of its k online, and
    precomputed at those of its k that are precomputed k too."""
    fractions = [fraction for fraction in recompute_fractions if fraction > 0]
    variants = [Variant("self-test: reuse off both sides", False)] if self_test else []
    variants += [Variant(f"online, k={k}", True, k) for k in k_values]
    variants += [Variant(f"online, k={k}, r={fraction:g}", True, k, fraction)
                 for fraction in fractions for k in recompute_k_values]
    variants += [Variant(f"precomputed, k={k}", True, k, is_precomputed=True) for k in precomputed_k_values]
    variants += [Variant(f"precomputed, k={k}, r={fraction:g}", True, k, fraction, is_precomputed=True)
                 for fraction in fractions for k in recompute_k_values if k in precomputed_k_values]
    variants += [Variant(f"precomputed alone, k={k}", True, k, is_precomputed=True, precomputed_alone=True)
                 for k in precomputed_alone_k_values]
    return variants


def recompute_fraction_error(model_dir: Path, fraction: float) -> str | None:
    """Why this engine refuses selective recompute at `fraction`, or None when it accepts it."""
    try:
        EngineConfig(model_dir=model_dir, documents=DocumentReuseConfig(recompute_fraction=fraction))
    except (TypeError, ValueError) as error:
        return str(error)
    return None


def run(args: argparse.Namespace, on_variant: Callable[[QualityRun], None] = lambda run: None) -> QualityRun:
    started = time.perf_counter()
    model_dir = pull(args.model)
    tokenizer = Tokenizer(model_dir)
    builder = PromptBuilder(SegmentTokenizer(tokenizer), ChatTemplate.from_model_dir(model_dir))
    pool, prompts = rag_prompts(args.num_prompts, args.pool_documents, args.documents_per_prompt,
                                args.document_words, args.seed)
    built = [build_prompt(builder, p) for p in prompts]
    pool_in_context = precompute_token_ids(builder, [{"text": text} for text in pool])  # as ingest precomputes them
    notes = []
    fractions = list(args.recompute_fractions)
    refusals = {f: error for f in fractions if (error := recompute_fraction_error(model_dir, f)) is not None}
    if refusals:
        notes.append(f"selective recompute not run: the engine refuses r = {', '.join(map(str, refusals))} "
                     f"({next(iter(refusals.values()))})")
        fractions = [f for f in fractions if f not in refusals]
    variants = variants_for(args.k_values, args.precomputed_k_values, fractions, args.recompute_k_values,
                            args.self_test, args.precomputed_alone_k_values)

    print(f"{len(built)} prompts, mean {sum(len(b.token_ids) for b in built) / len(built):.0f} tokens; "
          f"{len(variants)} reuse variants", file=sys.stderr)
    exact_started = time.perf_counter()  # the exact pass's own time: read from the cache when it is used
    answers, exact_commit, exact_seconds = load_exact_answers(args.exact_cache, [b.token_ids for b in built]) \
        if args.exact_cache else ([], "", 0.0)
    if len(answers) == len(built):
        notes.append(f"exact pass of {len(answers)} prompts read from {args.exact_cache} (computed at "
                     f"{exact_commit}, in {exact_seconds:.0f} s)")
    else:  # all again: the prefix cache must see the earlier prompts, as in one run
        exact_engine = _engine(model_dir, Variant("exact", False))
        answers = exact_pass(exact_engine, built, tokenizer)
        del exact_engine
        gc.collect()
        exact_seconds = time.perf_counter() - exact_started
        if args.exact_cache:
            save_exact_answers(args.exact_cache, [b.token_ids for b in built], answers, current_commit(), exact_seconds)

    scored = [(b.prompt, a) for b, a in zip(built, answers) if b.prompt.is_scored]
    accuracy = sum(answer_is_correct(a.answer_text, p) for p, a in scored) / len(scored) if scored else None

    def so_far(results: list[VariantResult]) -> QualityRun:
        return QualityRun(
            args=vars(args), model=str(model_dir), num_prompts=len(built),
            mean_prompt_tokens=sum(len(b.token_ids) for b in built) / len(built),
            num_pool_documents=len(pool), exact_seconds=exact_seconds,
            exact_computed_tokens=[a.num_computed_prompt_tokens for a in answers],
            exact_accuracy=accuracy, num_scored=len(scored), chance_accuracy=1 / args.documents_per_prompt,
            mean_answer_tokens=sum(len(a.answer_ids) for a in answers) / len(answers),
            sample_answers=[(b.prompt.messages[-1]["content"][-160:], a.answer_text)
                            for b, a in zip(built, answers)][:6],
            variants=list(results), notes=notes, total_seconds=time.perf_counter() - started)

    results: list[VariantResult] = []
    for variant in variants:
        engine = _engine(model_dir, variant)
        variant_started = time.perf_counter()
        comparisons, computed, reused, num_precomputed = reuse_pass(engine, variant, built, answers, pool_in_context)
        stats = engine.stats()
        results.append(VariantResult.of(variant, comparisons, computed, reused, num_precomputed,
                                        [b.prompt.style in PLAIN_STYLES for b in built],
                                        time.perf_counter() - variant_started, stats))
        del engine
        gc.collect()
        on_variant(so_far(results))  # a long run's finished variants are on disk before the next starts
    return so_far(results)


def _numbers(text: str, kind) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def _resolve_defaults(args: argparse.Namespace) -> None:
    """The full run's defaults, or --quick's; comma lists parsed ("" is an empty list)."""
    def listed(value: str | None, default: str, kind=int) -> list:
        return _numbers(default if value is None else value, kind)

    args.num_prompts = args.num_prompts or (40 if args.quick else 200)
    args.k_values = listed(args.k_values, "0,16" if args.quick else "0,4,16,32")
    args.precomputed_k_values = listed(args.precomputed_k_values, ",".join(map(str, args.k_values)))
    args.recompute_fractions = listed(args.recompute_fractions, "" if args.quick else "0.15", float)
    args.recompute_k_values = listed(args.recompute_k_values, ",".join(map(str, args.k_values)))
    args.precomputed_alone_k_values = listed(args.precomputed_alone_k_values, "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--num-prompts", type=int, help="default 200, quick 40")
    parser.add_argument("--k-values",
                        help="boundary tokens recomputed per reused span (default 0,4,16,32; quick 0,16; \"\": none)")
    parser.add_argument("--precomputed-k-values",
                        help="k of the precomputed (collection) variants (default: --k-values)")
    parser.add_argument("--precomputed-alone-k-values",
                        help="k of precomputed variants whose passages are computed alone, from position 0 "
                             "(default: none)")
    parser.add_argument("--recompute-fractions",
                        help="selective recompute fractions > 0, each run online (default 0.15; quick: none)")
    parser.add_argument("--recompute-k-values", help="k of the selective recompute variants (default: --k-values)")
    parser.add_argument("--self-test", action="store_true", help="also run reuse off on both sides")
    parser.add_argument("--quick", action="store_true", help="40 prompts, k 0 and 16, no selective recompute")
    parser.add_argument("--pool-documents", type=int, default=50, help="passages drawn from (default: 50)")
    parser.add_argument("--documents-per-prompt", type=int, default=4)
    parser.add_argument("--document-words", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--exact-cache", type=Path,
                        help="keep the exact pass's answers in this file and reuse them for the same prompts")
    args = parser.parse_args(argv)
    _resolve_defaults(args)
    stem = args.results_dir / (datetime.datetime.now().strftime("%Y-%m-%d_%H-%M") + "_document_reuse_quality"
                               + ("_quick" if args.quick else ""))
    quality = run(args, on_variant=lambda so_far: write_quality_report(so_far, stem))
    paths = write_quality_report(quality, stem)
    print(paths[1].read_text())
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

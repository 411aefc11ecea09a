"""Quality of quantized KV pages (--kv-dtype) against float32 KV, on the default model.

    .venv/bin/python -m bench.kv_dtype_quality [--num-prompts 200] [--kv-dtypes int8,bfloat16]
        [--variants int8:off,int8:on] [--prompts 0:25] [--exact-cache FILE] [--results FILE]
        [--backend auto|cpu|torch]

Half chat prompts (bench/int8_activation_quality.py's: a system prompt and a user turn about a
passage of real text), half RAG prompts (bench/document_reuse_prompts.py, the three styles, exact
document spans as the server finds them), built into token ids by the server's own prompt builder.
The reference engine (float32 KV, document reuse off) answers each greedily (up to 16 tokens), then
gives prompt_tail_logits(prompt + answer, len(answer) + 1): row 0 scores the first answer token,
the other rows the answer teacher-forced. Each variant (a KV dtype, document reuse off or on,
k = 4 boundary tokens, the store filled online by the earlier prompts) is a fresh engine making the
same call, prompts in order with the prefix cache on as served (later prompts read earlier prompts'
shared prefixes from the quantized pages). Reported per variant: first-token agreement, top-1
agreement over every teacher-forced row, mean KL(float32 || variant) per row. Every variant is compared
against float32 KV with document reuse off; "float32, reuse on" so shows what document reuse costs
alone, and a quantized dtype with reuse on carries reuse's approximation and the dtype's together. So
a quantized dtype with reuse on is also compared like with like, against float32 KV with reuse on (run
first, in the same prompt order, its rows kept in memory): that row is the dtype's own cost under
reuse. A dtype is offered where top-1 >= 0.98; the default changes only at >= 0.99 (README,
docs/performance.md).

Split runs (each a few minutes): --variants runs only these (`dtype:off|on`, comma-separated) instead
of every dtype of --kv-dtypes off and on plus float32 on (float32:on is added, and run first, wherever a
quantized dtype runs with reuse on); --prompts A:B only prompts [A, B) of the
--num-prompts list (a slice starts with a cold cache and an empty document store: its first prompts
find less cached than in one whole run); --exact-cache FILE keeps the reference pass on disk
(bench/document_reuse_exact_cache.py, keyed by each prompt's token ids); --results FILE appends each
prompt's numbers per variant and reference (JSON lines; a line without "reference" is against
float32:off) and prints the summary over every prompt the file holds for this --num-prompts and --seed,
the last result of a (variant, reference, prompt) counting.

--backend runs every engine, the float32 reference included, on that backend (default auto: cpu, whose C
kernels read float32, bfloat16 and int8 KV; float8 KV runs on the torch backend only, so measure it with
--backend torch --kv-dtypes float8). The exact cache keeps another backend's reference pass apart (its
keys are salted with the backend), and --results lines carry the backend; the summary counts this one's.

Equal reuse: the pool (512 MiB) and the document store (256 MiB) are sized in bytes, as served, so a
smaller format keeps more spans and more prompt tokens go through document reuse's approximation than
with float32. --equal-tokens sizes both in tokens instead, as many as float32's bytes hold, for every
dtype: then each variant reuses the same tokens (the "reused tokens" column says so) and a reuse-on row
against float32 reuse on is the format's own cost, rounding and re-rotation, not the store's size.
"""

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from assembly.chat_template import ChatTemplate
from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import SegmentTokenizer
from assembly.tokenizer import Tokenizer
from bench.document_reuse_exact_cache import ExactAnswer, current_commit, load_exact_answers, save_exact_answers
from bench.document_reuse_metrics import row_kl, row_top1_agreement
from bench.document_reuse_prompts import rag_prompts
from bench.document_reuse_quality import build_prompt
from bench.int8_activation_quality import chat_messages
from engine.document_reuse_config import DocumentReuseConfig
from engine.engine_config import EngineConfig
from engine.kv_dtype_config import KVDtypeConfig
from engine.llm_engine import LLMEngine
from engine.request_options import RequestOptions
from engine.sampling_params import SamplingParams
from kernels.kv_format import bytes_per_token_head
from model.backends import chosen_backend_name
from model.config import ModelConfig
from store.model_store import pull

NUM_ANSWER_TOKENS = 16
EXACT = "float32:off"  # the reference every variant is compared against
REUSE_EXACT = "float32:on"  # ... and each quantized dtype with reuse on, like with like
KV_CACHE_BYTES = 512 << 20
DOCUMENT_STORE_BYTES = 256 << 20


def _bytes_of(model_dir, kv_dtype: str, float32_bytes: int, equal_tokens: bool) -> int:
    """float32_bytes, or with equal_tokens the bytes that hold as many tokens in kv_dtype (K and V alike)."""
    if not equal_tokens:
        return float32_bytes
    head_dim = ModelConfig.from_model_dir(model_dir).head_dim
    return float32_bytes * bytes_per_token_head(kv_dtype, head_dim) // bytes_per_token_head("float32", head_dim)


def _engine(model_dir, kv_dtype: str, document_reuse: bool, equal_tokens: bool = False,
            backend: str = "auto") -> LLMEngine:
    documents = DocumentReuseConfig(enabled=document_reuse, boundary_tokens=4,
                                    store_bytes=_bytes_of(model_dir, kv_dtype, DOCUMENT_STORE_BYTES, equal_tokens))
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", documents=documents,
                                  kv_cache_bytes=_bytes_of(model_dir, kv_dtype, KV_CACHE_BYTES, equal_tokens),
                                  kv_dtype=KVDtypeConfig(kv_dtype), backend=backend))


def _comparisons(engine: LLMEngine, reuse: bool, prompts, answers, references: dict[str, list],
                 keep_rows: bool = False) -> tuple[dict[str, list[dict]], list]:
    """Per reference (name -> its rows per prompt) and prompt: first-token agreement, rows, rows agreeing
    on top-1, the sum of KL over rows; and this engine's rows per prompt when keep_rows (else [])."""
    results: dict[str, list[dict]] = {name: [] for name in references}
    kept = []
    for index, ((token_ids, spans), answer) in enumerate(zip(prompts, answers)):
        rows = engine.prompt_tail_logits(token_ids + answer, len(answer) + 1,
                                         options=RequestOptions(document_reuse=reuse, document_spans=spans)).float()
        for name, reference_rows in references.items():
            exact = reference_rows[index]
            agreement = row_top1_agreement(exact, rows)
            results[name].append(dict(first_same=bool(agreement[0]), num_rows=int(agreement.numel()),
                                      num_agree=int(agreement.sum()),
                                      kl_sum=float(row_kl(exact, rows).double().sum())))
        if keep_rows:
            kept.append(rows.clone())
    return results, kept


def _summary_line(name: str, reference: str, results: Sequence[dict], extra: str = "") -> str:
    num_rows = sum(r["num_rows"] for r in results)
    kv_dtype, _, reuse = name.partition(":")
    return (f"  {kv_dtype:<10} {reuse:<6} {reference:<12} {len(results):>8} "
            f"{sum(r['first_same'] for r in results) / len(results):>12.4f} "
            f"{sum(r['num_agree'] for r in results) / num_rows:>8.4f} {sum(r['kl_sum'] for r in results) / num_rows:>10.2e}"
            f"{extra}")


def _header(extra: str = "") -> str:
    return (f"  {'KV dtype':<10} {'reuse':<6} {'against':<12} {'prompts':>8} {'first token':>12} {'top-1':>8} "
            f"{'mean KL':>10}{extra}")


def _ordered_variants(variants: list[str]) -> list[str]:
    """variants with float32:on first wherever a quantized dtype runs with reuse on (its rows are their
    like-with-like reference), else as given."""
    if not any(v.endswith(":on") and v != REUSE_EXACT for v in variants):
        return variants
    return [REUSE_EXACT, *(v for v in variants if v != REUSE_EXACT)]


def _references_of(variant: str) -> tuple[str, ...]:
    return (EXACT, REUSE_EXACT) if variant.endswith(":on") and variant != REUSE_EXACT else (EXACT,)


def _backend_label(backend: str) -> str:
    """The backend an engine of this bench runs (its engines: the CPU, float32)."""
    return chosen_backend_name(backend, "cpu", torch.float32)


def _print_file_summary(path: Path, num_prompts: int, seed: int, backend: str = "auto") -> None:
    latest: dict[tuple[str, str, int], dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if (record["num_prompts"] == num_prompts and record["seed"] == seed
                and record.get("backend", "cpu") == _backend_label(backend)):
            latest[record["variant"], record.get("reference", EXACT), record["prompt"]] = record
    print(f"{path}: every prompt it holds of the {num_prompts} (seed {seed}, backend {_backend_label(backend)}), "
          f"against float32 KV with reuse off, "
          f"and with reuse on where it says so:")
    print(_header())
    for variant, reference in dict.fromkeys((name, against) for name, against, _ in latest):
        print(_summary_line(variant, reference, [r for (name, against, _), r in sorted(latest.items())
                                                 if (name, against) == (variant, reference)]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--kv-dtypes", default="int8,bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", default=None, help="only these, e.g. int8:off,int8:on (default: every "
                                                          "--kv-dtypes dtype off and on, then float32:on)")
    parser.add_argument("--prompts", default=None, help="A:B, only prompts [A, B) of the list")
    parser.add_argument("--exact-cache", type=Path, default=None, help="keep the reference pass in this file")
    parser.add_argument("--results", type=Path, default=None, help="append per-prompt results here (JSON lines)")
    parser.add_argument("--equal-tokens", action="store_true", help="size the pool and the document store in "
                        "tokens, float32's count for every dtype, so every variant reuses the same tokens")
    parser.add_argument("--backend", default="auto", choices=("auto", "cpu", "torch"),
                        help="the backend of every engine, the reference's included (float8 KV: torch)")
    args = parser.parse_args(argv)
    salt = "" if _backend_label(args.backend) == "cpu" else f"backend {args.backend}:"
    if args.variants:
        if any(variant.partition(":")[2] not in ("off", "on") for variant in args.variants.split(",")):
            parser.error(f"--variants takes dtype:off|on, comma-separated, got {args.variants!r}")
        variants = _ordered_variants(args.variants.split(","))
    else:  # the quantized dtypes first, float32 with reuse (reuse's own cost) last
        variants = [f"{kv_dtype}:{reuse}" for kv_dtype in args.kv_dtypes.split(",") for reuse in ("off", "on")]
        variants = _ordered_variants([*variants, REUSE_EXACT])
    first, last = 0, args.num_prompts
    if args.prompts:
        try:
            first, last = (int(part) for part in args.prompts.split(":"))
        except ValueError:
            parser.error(f"--prompts takes A:B, got {args.prompts!r}")
        if not 0 <= first < last <= args.num_prompts:
            parser.error(f"--prompts {args.prompts} is not a range within the {args.num_prompts} prompts")
    started = time.perf_counter()
    model_dir = pull(args.model)
    builder = PromptBuilder(SegmentTokenizer(Tokenizer(model_dir)), ChatTemplate.from_model_dir(model_dir))
    num_chat = args.num_prompts // 2
    _, rag = rag_prompts(args.num_prompts - num_chat, 24, 4, 120, args.seed)
    prompts = [(builder.build(messages), ()) for messages in chat_messages(num_chat, args.seed)]
    prompts += [(built.token_ids, built.exact_spans) for built in (build_prompt(builder, p) for p in rag)]
    prompts = prompts[first:last]

    prompt_ids = [token_ids for token_ids, _ in prompts]
    cached, _, _ = load_exact_answers(args.exact_cache, prompt_ids, salt) if args.exact_cache else ([], "", 0.0)
    answers, exact_rows = [c.answer_ids for c in cached], [c.rows for c in cached]
    if len(cached) < len(prompts):
        reference = _engine(model_dir, "float32", False, backend=args.backend)
        greedy = SamplingParams(max_tokens=NUM_ANSWER_TOKENS, temperature=0.0)
        for token_ids, spans in prompts[len(cached):]:
            (answer,) = reference.generate([token_ids], greedy)
            answers.append(answer)
            exact_rows.append(reference.prompt_tail_logits(token_ids + answer, len(answer) + 1,
                                                           options=RequestOptions(document_reuse=False,
                                                                                  document_spans=spans)
                                                           ).float().clone())
        reference.close()
        if args.exact_cache:
            save_exact_answers(args.exact_cache, prompt_ids,
                               [ExactAnswer(answer, "", rows, 0) for answer, rows in zip(answers, exact_rows)],
                               current_commit(), time.perf_counter() - started, salt)
    print(f"reference: {len(prompts)} prompts, {len(cached)} read from {args.exact_cache} "
          f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)

    lengths = [len(token_ids) for token_ids in prompt_ids]
    print(f"prompts {first}:{last} of {args.num_prompts} ({max(0, min(last, num_chat) - first)} chat; "
          f"{min(lengths)}-{max(lengths)} tokens, mean {sum(lengths) / len(lengths):.0f}), against float32 KV with "
          f"document reuse off ({EXACT}) and, for a quantized dtype with reuse on, with it on ({REUSE_EXACT}):")
    print(_header(f" {'reused tokens':>14} {'seconds':>8}"))
    references = {EXACT: exact_rows}
    for variant in variants:  # each line printed as it is done
        variant_started = time.perf_counter()
        kv_dtype, _, reuse = variant.partition(":")
        engine = _engine(model_dir, kv_dtype, reuse == "on", args.equal_tokens, args.backend)
        keep = variant == REUSE_EXACT and len(variants) > 1
        results, rows = _comparisons(engine, reuse == "on", prompts, answers,
                                     {name: references[name] for name in _references_of(variant)}, keep)
        if keep:
            references[REUSE_EXACT] = rows
        extra = (f" {engine.stats().documents.num_reused_tokens:>14} "
                 f"{time.perf_counter() - variant_started:>8.0f}")
        for reference, reference_results in results.items():
            print(_summary_line(variant, reference, reference_results, extra), flush=True)
        engine.close()
        if args.results:
            with args.results.open("a") as out:
                for reference, reference_results in results.items():
                    for index, result in enumerate(reference_results, start=first):
                        out.write(json.dumps(dict(variant=variant, reference=reference, num_prompts=args.num_prompts,
                                                  seed=args.seed, prompt=index, backend=_backend_label(args.backend),
                                                  **result)) + "\n")
    print(f"  ({time.perf_counter() - started:.0f} s)")
    if args.results:
        _print_file_summary(args.results, args.num_prompts, args.seed, args.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())

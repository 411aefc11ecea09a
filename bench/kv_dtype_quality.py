"""Quality of quantized KV pages (--kv-dtype) against float32 KV, on the default model.

    .venv/bin/python -m bench.kv_dtype_quality [--num-prompts 200] [--kv-dtypes int8,bfloat16]
        [--variants int8:off,int8:on] [--prompts 0:25] [--exact-cache FILE] [--results FILE]

Half chat prompts (bench/int8_activation_quality.py's: a system prompt and a user turn about a
passage of real text), half RAG prompts (bench/document_reuse_prompts.py, the three styles, exact
document spans as the server finds them), built into token ids by the server's own prompt builder.
The reference engine (float32 KV, document reuse off) answers each greedily (up to 16 tokens), then
gives prompt_tail_logits(prompt + answer, len(answer) + 1): row 0 scores the first answer token,
the other rows the answer teacher-forced. Each variant (a KV dtype, document reuse off or on,
k = 4 boundary tokens, the store filled online by the earlier prompts) is a fresh engine making the
same call, prompts in order with the prefix cache on as served (later prompts read earlier prompts'
shared prefixes from the quantized pages). Reported per variant: first-token agreement, top-1
agreement over every teacher-forced row, mean KL(float32 || variant) per row. "float32, reuse on"
shows what document reuse costs alone. A dtype is offered where top-1 >= 0.98; the default changes
only at >= 0.99 (README, docs/performance.md).

Split runs (each a few minutes): --variants runs only these (`dtype:off|on`, comma-separated) instead
of every dtype of --kv-dtypes off and on plus float32 on; --prompts A:B only prompts [A, B) of the
--num-prompts list (a slice starts with a cold cache and an empty document store: its first prompts
find less cached than in one whole run); --exact-cache FILE keeps the reference pass on disk
(bench/document_reuse_exact_cache.py, keyed by each prompt's token ids); --results FILE appends each
prompt's numbers per variant (JSON lines) and prints the summary over every prompt the file holds
for this --num-prompts and --seed, the last result of a (variant, prompt) counting.
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
from store.model_store import pull

NUM_ANSWER_TOKENS = 16
KV_CACHE_BYTES = 512 << 20
DOCUMENT_STORE_BYTES = 256 << 20


def _engine(model_dir, kv_dtype: str, document_reuse: bool) -> LLMEngine:
    documents = DocumentReuseConfig(enabled=document_reuse, store_bytes=DOCUMENT_STORE_BYTES, boundary_tokens=4)
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=KV_CACHE_BYTES,
                                  documents=documents, kv_dtype=KVDtypeConfig(kv_dtype)))


def _comparisons(engine: LLMEngine, reuse: bool, prompts, answers, exact_rows) -> list[dict]:
    """Per prompt: first-token agreement, rows, rows agreeing on top-1, the sum of KL over rows."""
    results = []
    for (token_ids, spans), answer, exact in zip(prompts, answers, exact_rows):
        rows = engine.prompt_tail_logits(token_ids + answer, len(answer) + 1,
                                         options=RequestOptions(document_reuse=reuse, document_spans=spans)).float()
        agreement = row_top1_agreement(exact, rows)
        results.append(dict(first_same=bool(agreement[0]), num_rows=int(agreement.numel()),
                            num_agree=int(agreement.sum()), kl_sum=float(row_kl(exact, rows).double().sum())))
    return results


def _summary_line(name: str, results: Sequence[dict], extra: str = "") -> str:
    num_rows = sum(r["num_rows"] for r in results)
    kv_dtype, _, reuse = name.partition(":")
    return (f"  {kv_dtype:<10} {reuse:<6} {len(results):>8} {sum(r['first_same'] for r in results) / len(results):>12.4f} "
            f"{sum(r['num_agree'] for r in results) / num_rows:>8.4f} {sum(r['kl_sum'] for r in results) / num_rows:>10.2e}"
            f"{extra}")


def _print_file_summary(path: Path, num_prompts: int, seed: int) -> None:
    latest: dict[tuple[str, int], dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["num_prompts"] == num_prompts and record["seed"] == seed:
            latest[record["variant"], record["prompt"]] = record
    print(f"{path}: every prompt it holds of the {num_prompts} (seed {seed}), against float32 KV with reuse off:")
    print(f"  {'KV dtype':<10} {'reuse':<6} {'prompts':>8} {'first token':>12} {'top-1':>8} {'mean KL':>10}")
    for variant in dict.fromkeys(name for name, _ in latest):
        print(_summary_line(variant, [r for (name, _), r in sorted(latest.items()) if name == variant]))


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
    args = parser.parse_args(argv)
    if args.variants:
        if any(variant.partition(":")[2] not in ("off", "on") for variant in args.variants.split(",")):
            parser.error(f"--variants takes dtype:off|on, comma-separated, got {args.variants!r}")
        variants = args.variants.split(",")
    else:  # the quantized dtypes first, float32 with reuse (reuse's own cost) last
        variants = [f"{kv_dtype}:{reuse}" for kv_dtype in args.kv_dtypes.split(",") for reuse in ("off", "on")]
        variants.append("float32:on")
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
    cached, _, _ = load_exact_answers(args.exact_cache, prompt_ids) if args.exact_cache else ([], "", 0.0)
    answers, exact_rows = [c.answer_ids for c in cached], [c.rows for c in cached]
    if len(cached) < len(prompts):
        reference = _engine(model_dir, "float32", False)
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
                               current_commit(), time.perf_counter() - started)
    print(f"reference: {len(prompts)} prompts, {len(cached)} read from {args.exact_cache} "
          f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)

    lengths = [len(token_ids) for token_ids in prompt_ids]
    print(f"prompts {first}:{last} of {args.num_prompts} ({max(0, min(last, num_chat) - first)} chat; "
          f"{min(lengths)}-{max(lengths)} tokens, mean {sum(lengths) / len(lengths):.0f}), against float32 KV with "
          f"document reuse off:")
    print(f"  {'KV dtype':<10} {'reuse':<6} {'prompts':>8} {'first token':>12} {'top-1':>8} {'mean KL':>10} "
          f"{'reused tokens':>14} {'seconds':>8}")
    for variant in variants:  # each line printed as it is done
        variant_started = time.perf_counter()
        kv_dtype, _, reuse = variant.partition(":")
        engine = _engine(model_dir, kv_dtype, reuse == "on")
        results = _comparisons(engine, reuse == "on", prompts, answers, exact_rows)
        print(_summary_line(variant, results, f" {engine.stats().documents.num_reused_tokens:>14} "
                                              f"{time.perf_counter() - variant_started:>8.0f}"), flush=True)
        engine.close()
        if args.results:
            with args.results.open("a") as out:
                for index, result in enumerate(results, start=first):
                    out.write(json.dumps(dict(variant=variant, num_prompts=args.num_prompts, seed=args.seed,
                                              prompt=index, **result)) + "\n")
    print(f"  ({time.perf_counter() - started:.0f} s)")
    if args.results:
        _print_file_summary(args.results, args.num_prompts, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())

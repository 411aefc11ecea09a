"""Quality of the cpu backend's bf16, int8 (or int16) activations against float32 ones, on the default model.

    .venv/bin/python -m bench.int8_activation_quality [--num-prompts 200] [--rows 32] [--cpu-kernels auto]
        [--float-activation-layers lm_head,down_proj]
        [--path bf16,int8,int16-decode]

`--path` names one path or several, comma-separated: each is scored against the same float32 reference
in one run (the reference is computed once). `bf16`: prefill's GEMMs in bfloat16
(EngineConfig.prefill_dtype; needs native bf16), the LM head float32 (cpu_backend.BF16_FLOAT_LAYERS);
`bf16-all`: the LM head in bfloat16 too. `int8`: the int8 GEMM over blocks. On a quiet 2-core AVX-512
machine 200 prompts should take about 6-8 minutes for bf16 alone (an estimate: docs/performance.md).
`int16-decode` scores the decode kernels' int16 activations (kernels/block_matmul.py's
matmul_q16) as serving runs them: the prompt prefilled on the float path, then the teacher-forced
rows (the last `--rows` positions, and the rest of their page) computed through the int16 few-rows
kernels over that cached prefix, one engine switched between float32 and int16 for its tail rows.
(A row's result does not depend on how many rows a kernel call takes, so the tail in one call
scores exactly what decode computes one token at a time.)

Half chat prompts (a system prompt and a user turn about a passage of real text), half RAG
prompts (bench/document_reuse_prompts.py, the three styles), built into token ids by the
server's own prompt builder. The float32 engine answers each greedily (16 tokens); then every
engine returns the logits of the last `--rows` positions of prompt + answer (teacher-forced:
the same tokens for all): each path's engine prefills it cold (prefix cache off), the float32
one reuses its own cached KV of the prompt where it can (float32 KV is the reference either way).
The int8 engine runs every projection it can on int8 activations, but those named by
--float-activation-layers (model/backends/cpu_backend.py, INT8_FLOAT_ACTIVATION_LAYERS). Reported: top-1 agreement and
mean KL(float32 || int8) per token, and the first answer token's agreement. The int8 path
is the default only where top-1 agreement is >= 0.99 (docs/performance.md).
"""

import argparse
import functools
import random
import sys
import time
from collections.abc import Sequence

import torch

from assembly.chat_template import ChatTemplate
from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import SegmentTokenizer
from assembly.tokenizer import Tokenizer
from bench import corpus
from bench.document_reuse_metrics import row_kl, row_top1_agreement
from bench.document_reuse_prompts import rag_prompts
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from model import backends
from kernels import cpu_gemm_q8
from kernels.cpu_features import resolve_variant, this_cpu
from kernels.native_build import NativeUnavailable
from model.backends.cpu_backend import INT8_FLOAT_ACTIVATION_LAYERS, CpuBackend
from model.backends.cpu_linear import BlockLinear, CpuLinear
from store.model_store import pull, radixserve_home

PATHS = ("bf16", "bf16-all", "int8", "int16-decode")
NUM_ANSWER_TOKENS = 16
KV_CACHE_BYTES = 256 << 20
# The float32 engine answers this many prompts in one batch: a decode step reads the weights once for
# all of them (the answers dominated the run's time one prompt at a time).
ANSWER_BATCH = 8
CHAT_SYSTEM = "You are a helpful assistant. Answer briefly and precisely."
CHAT_ASKS = ("Summarize this in two sentences:", "What is the main point of this passage?",
             "Explain this to a beginner:", "List the key terms used here:")


def chat_messages(num_prompts: int, seed: int) -> list[list[dict]]:
    rng = random.Random(f"{seed}-quantized-prefill-chat")
    paragraphs = corpus.paragraphs()
    return [[{"role": "system", "content": CHAT_SYSTEM},
             {"role": "user", "content": f"{rng.choice(CHAT_ASKS)}\n\n{rng.choice(paragraphs)}"}]
            for _ in range(num_prompts)]


def _engine(model_dir, int8_activations: bool, cpu_kernels: str, float_layers: tuple[str, ...] = (),
            prefill_dtype: str = "float32") -> LLMEngine:
    """The reference (every option at float32) keeps its prefix cache; any other engine prefills cold."""
    if float_layers:  # the backend's constructor argument, for this measurement only
        backends.CpuBackend = functools.partial(CpuBackend, float_activation_layers=float_layers)
    is_reference = not int8_activations and prefill_dtype == "float32"
    engine = LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=KV_CACHE_BYTES,
                                    enable_prefix_cache=is_reference, int8_activations=int8_activations,
                                    cpu_kernels=cpu_kernels, decode_activations="float32",
                                    prefill_dtype=prefill_dtype))
    backends.CpuBackend = CpuBackend
    return engine


class Int16TailRows:
    """Switches an engine's few-rows products over blocks to int16 activations for every row count
    (the tail rows of prompt_tail_logits go through the decode kernels), and back to float32. Its Q4_1 / Q4_K
    projections get the copies in interleaved rows that an int16-decode engine holds
    (model/backends/decode_copies.py), where their kernels run here, so the kernels scored are the ones serving decodes with."""

    def __init__(self, engine: LLMEngine, cpu_kernels: str):
        self.backend = engine.backend
        self.modules = [m for m in engine.model.modules()
                        if isinstance(m, BlockLinear) or (isinstance(m, CpuLinear) and m.few_rows is not None)]
        self.limits = [(m.few_rows_max, m.kernel_rows_max) for m in self.modules]
        self.activations = self.backend.decode_activations
        try:
            interleaved = cpu_gemm_q8.load(radixserve_home() / "kernels", variant=resolve_variant(cpu_kernels, this_cpu())[0])
        except NativeUnavailable as error:
            print(f"int16-decode over the blocks only ({error})", file=sys.stderr)
            return
        for module in self.modules:
            parts = module.parts if isinstance(module, BlockLinear) else module.few_rows.keywords["parts"]
            if all(part.format in interleaved.q16_formats for part in parts):
                self.backend.decode_copies.add(interleaved, parts)

    def __enter__(self):
        self.backend.decode_activations = "int16"
        for module in self.modules:  # every row count through the few-rows kernels (in groups of 8)
            module.few_rows_max = module.kernel_rows_max = sys.maxsize

    def __exit__(self, *exc_info):
        self.backend.decode_activations = self.activations
        for module, (limit, kernel_limit) in zip(self.modules, self.limits):
            module.few_rows_max, module.kernel_rows_max = limit, kernel_limit


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--rows", type=int, default=32, help="teacher-forced positions compared per prompt")
    parser.add_argument("--cpu-kernels", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--path", default="bf16",
                        help=f"of {', '.join(PATHS)}, comma-separated: bf16: prefill's GEMMs in bfloat16 (bf16-all: the LM "
                             "head too); int8: the "
                             "int8 GEMM (prefill and decode); int16-decode: the teacher-forced tail rows through the "
                             "few-rows kernels with int16 activations")
    parser.add_argument("--float-activation-layers", default=",".join(INT8_FLOAT_ACTIVATION_LAYERS),
                        help="projections (last name part, comma-separated) the int8 engine keeps on float activations")
    args = parser.parse_args(argv)
    paths = tuple(filter(None, args.path.split(",")))
    if not paths or any(path not in PATHS for path in paths):
        parser.error(f"--path takes {', '.join(PATHS)}, comma-separated, got {args.path!r}")
    if args.rows <= NUM_ANSWER_TOKENS:  # the first answer token's row must be among them
        parser.error(f"--rows must be more than the {NUM_ANSWER_TOKENS} answer tokens")
    started = time.perf_counter()
    model_dir = pull(args.model)
    builder = PromptBuilder(SegmentTokenizer(Tokenizer(model_dir)), ChatTemplate.from_model_dir(model_dir))
    num_chat = args.num_prompts // 2
    _, rag = rag_prompts(args.num_prompts - num_chat, 24, 4, 120, args.seed)
    prompts = [builder.build(messages) for messages in chat_messages(num_chat, args.seed)]
    prompts += [builder.build(list(p.messages), documents=[dict(d) for d in p.documents] or None) for p in rag]
    float_layers = tuple(filter(None, args.float_activation_layers.split(",")))
    reference = _engine(model_dir, False, args.cpu_kernels)
    print(f"float32: {reference.backend.describe()}", file=sys.stderr)
    engines = {}
    for path in paths:  # int16-decode: the reference itself, switched for its tail rows
        engines[path] = reference if path == "int16-decode" else _path_engine(path, model_dir, args.cpu_kernels,
                                                                               float_layers)
        print(f"{path}: {engines[path].backend.describe()}", file=sys.stderr)
    int16_tail = Int16TailRows(reference, args.cpu_kernels)
    greedy = SamplingParams(max_tokens=NUM_ANSWER_TOKENS, temperature=0.0)
    scores = {path: ([], [], []) for path in paths}  # path -> (KL rows, agreement rows, first answer token same)
    answers: list[list[int]] = []
    for index, prompt in enumerate(prompts):
        if index % ANSWER_BATCH == 0:  # greedy answers are the same batched and alone (tested)
            answers = reference.generate(prompts[index:index + ANSWER_BATCH], greedy)
        answer = answers[index % ANSWER_BATCH]  # its prompt's KV is most likely still cached
        tokens = prompt + answer
        rows = min(args.rows, len(tokens))
        exact = reference.prompt_tail_logits(tokens, rows).float()
        first = rows - len(answer) - 1  # the row that scores the first answer token
        for path, engine in engines.items():
            if path == "int16-decode":
                with int16_tail:  # the same cached float prefix; the tail rows through the int16 kernels
                    approx = engine.prompt_tail_logits(tokens, rows).float()
            else:
                approx = engine.prompt_tail_logits(tokens, rows).float()
            kls, agreements, first_same = scores[path]
            kls.append(row_kl(exact, approx))
            agreements.append(row_top1_agreement(exact, approx))
            first_same.append(bool(agreements[-1][first]))
        if (index + 1) % 20 == 0:  # running agreement too: a run stopped early still says something
            running = ", ".join(f"{path} {torch.cat(agreements).double().mean():.4f}"
                                for path, (_, agreements, _) in scores.items())
            print(f"  {index + 1}/{len(prompts)} ({time.perf_counter() - started:.0f} s): top-1 {running}",
                  file=sys.stderr, flush=True)
    lengths = [len(p) for p in prompts]
    print(f"{len(prompts)} prompts ({num_chat} chat, {len(prompts) - num_chat} RAG; {min(lengths)}-{max(lengths)} "
          f"tokens, mean {sum(lengths) / len(lengths):.0f}), kernels {reference.backend.instruction_sets}:")
    for path, (kls, agreements, first_same) in scores.items():
        kl, agree = torch.cat(kls), torch.cat(agreements).double()
        print(f"  {path}: {kl.numel()} teacher-forced positions")
        print(f"    top-1 agreement {path} vs float32: {agree.mean():.4f}")
        print(f"    mean KL(float32 || {path}) per token: {kl.mean():.2e} nats (p99 {kl.quantile(0.99):.2e}, "
              f"max {kl.max():.2e})")
        print(f"    first answer token agreement: {sum(first_same) / len(first_same):.4f}")
    print(f"  ({time.perf_counter() - started:.0f} s)")
    return 0


def _path_engine(path: str, model_dir, cpu_kernels: str, float_layers: tuple[str, ...]) -> LLMEngine:
    if path == "bf16":
        return _engine(model_dir, False, cpu_kernels, prefill_dtype="bfloat16")
    if path == "bf16-all":  # the LM head too (cpu_backend.BF16_FLOAT_LAYERS keeps it float32 by default)
        backends.CpuBackend = functools.partial(CpuBackend, bf16_float_layers=())
        return _engine(model_dir, False, cpu_kernels, prefill_dtype="bfloat16")
    return _engine(model_dir, True, cpu_kernels, float_layers)  # int8


if __name__ == "__main__":
    sys.exit(main())

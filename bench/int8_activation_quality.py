"""Quality of the cpu backend's int8 (or int16) activations against float32 ones, on the default model.

    .venv/bin/python -m bench.int8_activation_quality [--num-prompts 200] [--rows 32] [--cpu-kernels auto]
        [--float-activation-layers lm_head,down_proj]
        [--path int8|int16-decode]

`--path int16-decode` scores the decode kernels' int16 activations (kernels/block_matmul.py's
matmul_q16) as serving runs them: the prompt prefilled on the float path, then the teacher-forced
rows (the last `--rows` positions, and the rest of their page) computed through the int16 few-rows
kernels over that cached prefix, one engine switched between float32 and int16 for its tail rows.
(A row's result does not depend on how many rows a kernel call takes, so the tail in one call
scores exactly what decode computes one token at a time.)

Half chat prompts (a system prompt and a user turn about a passage of real text), half RAG
prompts (bench/document_reuse_prompts.py, the three styles), built into token ids by the
server's own prompt builder. The float32 engine answers each greedily (16 tokens); then both
engines return the logits of the last `--rows` positions of prompt + answer (teacher-forced:
the same tokens for both): the int8 engine prefills it cold (prefix cache off), the float32
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
from model.backends.cpu_backend import INT8_FLOAT_ACTIVATION_LAYERS, CpuBackend
from model.backends.cpu_linear import BlockLinear, CpuLinear
from store.model_store import pull

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


def _engine(model_dir, int8_activations: bool, cpu_kernels: str, float_layers: tuple[str, ...] = ()) -> LLMEngine:
    if float_layers:  # the backend's constructor argument, for this measurement only
        backends.CpuBackend = functools.partial(CpuBackend, float_activation_layers=float_layers)
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=KV_CACHE_BYTES,
                                  enable_prefix_cache=not int8_activations,
                                  int8_activations=int8_activations,
                                  cpu_kernels=cpu_kernels, decode_activations="float32"))


class Int16TailRows:
    """Switches an engine's few-rows products over blocks to int16 activations for every row count
    (the tail rows of prompt_tail_logits go through the decode kernels), and back to float32."""

    def __init__(self, engine: LLMEngine):
        self.backend = engine.backend
        self.modules = [m for m in engine.model.modules()
                        if isinstance(m, BlockLinear) or (isinstance(m, CpuLinear) and m.few_rows is not None)]
        self.limits = [m.few_rows_max for m in self.modules]
        self.activations = self.backend.decode_activations

    def __enter__(self):
        self.backend.decode_activations = "int16"
        for module in self.modules:
            module.few_rows_max = sys.maxsize

    def __exit__(self, *exc_info):
        self.backend.decode_activations = self.activations
        for module, limit in zip(self.modules, self.limits):
            module.few_rows_max = limit


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--num-prompts", type=int, default=200)
    parser.add_argument("--rows", type=int, default=32, help="teacher-forced positions compared per prompt")
    parser.add_argument("--cpu-kernels", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--path", choices=("int8", "int16-decode"), default="int8",
                        help="int8: the int8 GEMM (prefill and decode); int16-decode: the few-rows kernels with "
                             "int16 activations, forced for every row")
    parser.add_argument("--float-activation-layers", default=",".join(INT8_FLOAT_ACTIVATION_LAYERS),
                        help="projections (last name part, comma-separated) the int8 engine keeps on float activations")
    args = parser.parse_args(argv)
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
    if args.path == "int8":
        quantized = _engine(model_dir, True, args.cpu_kernels, float_layers)
        print(f"float32: {reference.backend.describe()}\nint8: {quantized.backend.describe()}", file=sys.stderr)
    else:
        quantized, int16_tail = reference, Int16TailRows(reference)
        print(f"float32, int16 tail rows: {reference.backend.describe()}", file=sys.stderr)
    greedy = SamplingParams(max_tokens=NUM_ANSWER_TOKENS, temperature=0.0)
    kls, agreements, first_same = [], [], []
    answers: list[list[int]] = []
    for index, prompt in enumerate(prompts):
        if index % ANSWER_BATCH == 0:  # greedy answers are the same batched and alone (tested)
            answers = reference.generate(prompts[index:index + ANSWER_BATCH], greedy)
        answer = answers[index % ANSWER_BATCH]  # its prompt's KV is most likely still cached
        tokens = prompt + answer
        rows = min(args.rows, len(tokens))
        exact = reference.prompt_tail_logits(tokens, rows).float()
        if args.path == "int8":
            approx = quantized.prompt_tail_logits(tokens, rows).float()
        else:
            with int16_tail:  # the same cached float prefix; the tail rows through the int16 kernels
                approx = quantized.prompt_tail_logits(tokens, rows).float()
        kls.append(row_kl(exact, approx))
        agreements.append(row_top1_agreement(exact, approx))
        first = rows - len(answer) - 1  # the row that scores the first answer token
        first_same.append(bool(agreements[-1][first]))
        if (index + 1) % 40 == 0:
            print(f"  {index + 1}/{len(prompts)}", file=sys.stderr, flush=True)
    kl, agree = torch.cat(kls), torch.cat(agreements).double()
    lengths = [len(p) for p in prompts]
    print(f"{len(prompts)} prompts ({num_chat} chat, {len(prompts) - num_chat} RAG; {min(lengths)}-{max(lengths)} "
          f"tokens, mean {sum(lengths) / len(lengths):.0f}), {kl.numel()} teacher-forced positions, "
          f"path {args.path}, kernels {quantized.backend.instruction_sets}:")
    print(f"  top-1 agreement {args.path} vs float32: {agree.mean():.4f}")
    print(f"  mean KL(float32 || {args.path}) per token: {kl.mean():.2e} nats (p99 {kl.quantile(0.99):.2e}, "
          f"max {kl.max():.2e})")
    print(f"  first answer token agreement: {sum(first_same) / len(first_same):.4f}")
    print(f"  ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

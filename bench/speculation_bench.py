"""In-process speculation benchmark: decode tok/s and mean acceptance length, off / ngram / suffix.

    .venv/bin/python -m bench.speculation_bench [--requests 4] [--max-tokens 64] [--batch 8]

One engine, one copy of the weights; the variants differ only in the engine's draft proposer
(None, prompt lookup, prompt lookup + a suffix index that persists across the run), and every
request runs under each variant in turn, interleaved, so a noisy neighbour slows all alike.
Workloads: (a) RAG answers asked to quote their documents (bench/rag_workload.py prompts plus a
quoting instruction), (b) agent turns (bench/agent_workload.py sessions, each turn's reply fed
back): `agent` with the tools as system-prompt text, where the default model answers in prose and
never calls one, and `agent_tool_calls` with the tools as OpenAI `tools` under tool_choice
"required", as the server runs it (its grammar: a forced call, assembly/constrained_output.py), so
every turn is a tool call, (c) random chat (bench/random_workload.py). Batch 1: each request alone
(bench.engine_bench.run_alone's timing); batch N: N requests at once. Greedy, so every variant
emits the same tokens (checked). Decode tok/s counts the tokens of steps that ran no prefill over
those steps' time: by default the CPU time of the bench's one thread (torch and the C kernels set to
one thread), which other tenants of a shared machine do not inflate as they do wall time
(`--wall-clock --threads N` measures wall time instead).
"""

import argparse
import time
from dataclasses import replace

import torch

from assembly.chat_template import ChatTemplate
from assembly.constrained_output import GrammarCompiler, tool_call_grammar
from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import SegmentTokenizer
from assembly.tokenizer import Tokenizer
from bench.agent_tools import TOOLS
from bench.agent_workload import agent_workload
from bench.rag_workload import rag_workload
from bench.random_workload import random_workload
from bench.workload_sizes import WorkloadSizes
from engine.draft_proposer import DraftProposer
from engine.speculation_config import DEFAULT_MAX_DRAFT_TOKENS, SpeculationConfig
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.request import RequestStatus
from engine.sampling_params import SamplingParams
from store.model_store import DEFAULT_MODEL, pull

VARIANTS = ("off", "ngram", "suffix")
QUOTE_INSTRUCTION = " Answer by quoting the relevant sentences of the document word for word."
KV_CACHE_BYTES = 256 << 20


class Measure:
    """Decode tokens and seconds of one variant, summed over its runs."""

    def __init__(self, clock):
        self.clock = clock  # time.thread_time (one thread's CPU seconds) or time.perf_counter
        self.num_tokens = 0
        self.seconds = 0.0
        self.num_draft = self.num_accepted = self.num_verify = 0

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0

    @property
    def acceptance_length(self) -> float:
        return 1 + self.num_accepted / self.num_verify if self.num_verify else 1.0


def run_batch(engine: LLMEngine, prompts: list[list[int]], max_tokens: int, measure: Measure,
              grammar_processor=None) -> list[list[int]]:
    """Run `prompts` together to completion (greedy); add their decode tokens and time to `measure`.
    `grammar_processor()`: a fresh logits processor for each request (a grammar's mask), or None."""
    requests = []
    for i, prompt in enumerate(prompts):
        processors = (grammar_processor(),) if grammar_processor is not None else ()
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logits_processors=processors)
        requests.append(engine.add_request(f"spec-{time.perf_counter_ns()}-{i}", prompt, params))
    metrics = engine.metrics
    before = (metrics.num_draft_tokens, metrics.num_accepted_draft_tokens, metrics.num_verify_chunks)
    while engine.has_unfinished():
        is_decode_only = not engine.scheduler.waiting and all(
            r.status is RequestStatus.RUNNING for r in engine.scheduler.admitted)
        started = measure.clock()
        outputs = engine.step()
        seconds = measure.clock() - started
        if is_decode_only:
            measure.seconds += seconds
            measure.num_tokens += sum(len(o.new_token_ids) for o in outputs)
    measure.num_draft += metrics.num_draft_tokens - before[0]
    measure.num_accepted += metrics.num_accepted_draft_tokens - before[1]
    measure.num_verify += metrics.num_verify_chunks - before[2]
    return [list(r.output_token_ids) for r in requests]


def run_variants(engine: LLMEngine, proposers: dict, prompts: list[list[int]], max_tokens: int, batch: int,
                 measures: dict[str, Measure], grammar_processor=None) -> list[list[int]]:
    """Every group of `batch` prompts under each variant in turn; the outputs (equal across variants)."""
    outputs = []
    for start in range(0, len(prompts), batch):
        group = prompts[start:start + batch]
        by_variant = {}
        for name in VARIANTS:
            engine.proposer = proposers[name]
            by_variant[name] = run_batch(engine, group, max_tokens, measures[name], grammar_processor)
        for name in VARIANTS[1:]:
            if by_variant[name] != by_variant["off"]:
                print(f"  note: {name} output differs from off (greedy should be identical)")
        outputs += by_variant["off"]
    return outputs


def render(template: ChatTemplate, tokenizer: Tokenizer, messages) -> list[int]:
    return tokenizer.encode(template.render(list(messages)))


def rag_prompts(template, tokenizer, num: int, seed: int) -> list[list[int]]:
    workload = rag_workload(replace(WorkloadSizes(), rag_num_requests=num), seed)
    prompts = []
    for session in workload.sessions:
        system, user = session.first_request().messages
        prompts.append(render(template, tokenizer, (system, {**user, "content": user["content"] + QUOTE_INSTRUCTION})))
    return prompts


def random_prompts(template, tokenizer, num: int, seed: int) -> list[list[int]]:
    workload = random_workload(replace(WorkloadSizes(), random_num_requests=num, random_max_words=300), seed)
    return [render(template, tokenizer, s.first_request().messages) for s in workload.sessions]


def bench_agent(engine, proposers, template, tokenizer, num_sessions: int, num_turns: int, max_tokens: int,
                batch: int, measures, tool_calls: bool = False) -> None:
    """Sessions advance turn by turn, `batch` sessions' turns at once; replies fed back.
    `tool_calls`: the tools go as OpenAI `tools` (laid out by the server's PromptBuilder) and every
    turn is a forced call (tool_choice "required": the server's grammar for it)."""
    builder = PromptBuilder(SegmentTokenizer(tokenizer), template)
    sizes = replace(WorkloadSizes(), agent_num_sessions=num_sessions, agent_num_turns=num_turns)
    sessions = list(agent_workload(sizes, seed=0, native_tools=tool_calls).sessions)
    grammar_processor = None
    if tool_calls:
        compiler = GrammarCompiler(tokenizer.path, sorted(engine.eos_token_ids), engine.vocab_size)
        grammar = tool_call_grammar([{"name": t["function"]["name"], "parameters": t["function"].get("parameters")}
                                     for t in TOOLS], parallel=False)

        def grammar_processor():  # one per request: a processor follows its request's tokens
            return compiler.processor(grammar)
    requests = [s.first_request() for s in sessions]
    while any(r is not None for r in requests):
        live = [i for i, r in enumerate(requests) if r is not None]
        prompts = [builder.build(requests[i].messages, tools=list(requests[i].tools), use_cache=False) if tool_calls
                   else render(template, tokenizer, requests[i].messages) for i in live]
        replies = run_variants(engine, proposers, prompts, max_tokens, batch, measures, grammar_processor)
        for i, reply in zip(live, replies):
            requests[i] = sessions[i].next_request(tokenizer.decode(reply))


def report(title: str, measures: dict[str, Measure]) -> None:
    base = measures["off"].tokens_per_second
    cells = []
    for name in VARIANTS:
        m = measures[name]
        ratio = m.tokens_per_second / base if base else 0.0
        cells.append(f"{name} {m.tokens_per_second:6.1f} tok/s ({ratio:4.2f}x, accept len {m.acceptance_length:4.2f}, "
                     f"{m.num_accepted}/{m.num_draft} drafts)")
    print(f"{title:<18} " + " | ".join(cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--requests", type=int, default=4, help="RAG / random prompts, agent sessions")
    parser.add_argument("--turns", type=int, default=3, help="agent turns per session")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="the concurrent batch (besides batch 1)")
    parser.add_argument("--max-draft-tokens", type=int, default=DEFAULT_MAX_DRAFT_TOKENS)
    parser.add_argument("--workloads", default="rag,agent,agent_tool_calls,random")
    parser.add_argument("--threads", type=int, default=1, help="torch / C kernel threads (default 1)")
    parser.add_argument("--wall-clock", action="store_true", help="time steps in wall time, not thread CPU time")
    args = parser.parse_args()
    clock = time.perf_counter if args.wall_clock else time.thread_time
    if not args.wall_clock and args.threads != 1:
        raise SystemExit("thread CPU time counts one thread: use --threads 1, or --wall-clock")
    torch.set_num_threads(args.threads)
    model_dir = pull(args.model, progress=False)
    engine = LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", dtype="float32", kv_cache_bytes=KV_CACHE_BYTES,
                                    speculation=SpeculationConfig("ngram")))  # "ngram" only builds the engine's proposer; swapped below
    print(f"  {engine.backend.describe()}", flush=True)
    template, tokenizer = ChatTemplate.from_model_dir(model_dir), Tokenizer(model_dir)
    for batch in (1, args.batch):
        # fresh proposers per batch size: the suffix index learns within one batch size's run
        costs = engine.backend.policy.verify_row_costs
        proposers = {"off": None,
                     "ngram": DraftProposer("ngram", args.max_draft_tokens, row_costs=costs),
                     "suffix": DraftProposer("suffix", args.max_draft_tokens, row_costs=costs)}
        num = max(args.requests, batch) if batch > 1 else args.requests
        for workload in args.workloads.split(","):
            measures = {name: Measure(clock) for name in VARIANTS}
            if workload == "rag":
                run_variants(engine, proposers, rag_prompts(template, tokenizer, num, 0), args.max_tokens, batch,
                             measures)
            elif workload in ("agent", "agent_tool_calls"):
                bench_agent(engine, proposers, template, tokenizer, num, args.turns, args.max_tokens, batch,
                            measures, tool_calls=workload == "agent_tool_calls")
            elif workload == "random":
                run_variants(engine, proposers, random_prompts(template, tokenizer, num, 0), args.max_tokens,
                             batch, measures)
            else:
                raise SystemExit(f"unknown workload {workload!r}")
            report(f"{workload} batch {batch}", measures)


if __name__ == "__main__":
    main()

"""What a speculative verify chunk of r rows costs against a plain decode step: the backend's row-cost table.

    .venv/bin/python -m bench.verify_row_costs [--context 600] [--max-rows 8] [--repeats 9]

One request decodes after a `--context`-token prompt; every step it verifies a chunk of r rows (its
last token + r - 1 drafts that are never accepted, so the sequence grows one token a step and the
context stays near the prompt's length), r = 1..max_rows in turn, `--repeats` rounds. Each r's best
step time (one thread's CPU time by default, like bench.speculation_bench) over the 1-row best is the
table StepPolicy.verify_row_costs holds (model/backends/cpu_row_limits.py: CPU_VERIFY_ROW_COSTS).
"""

import argparse
import time

import torch

from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.request import RequestStatus
from engine.sampling_params import SamplingParams
from engine.speculation_config import SpeculationConfig
from store.model_store import DEFAULT_MODEL, pull

KV_CACHE_BYTES = 256 << 20


class RejectedDrafts:
    """A stand-in proposer: `num_drafts` drafts of a token the model does not emit next (verified and
    discarded, as a wrong guess is)."""

    def __init__(self):
        self.num_drafts = 0

    def propose(self, request, max_tokens: int) -> list[int]:
        last = request.all_token_ids[-1]
        return [last] * min(self.num_drafts, max_tokens)

    def observe(self, request, num_drafted: int, num_accepted: int) -> None:
        pass

    def record_finished(self, request) -> None:
        pass

    def forget(self, request) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--context", type=int, default=600, help="prompt tokens before the decode")
    parser.add_argument("--max-rows", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--wall-clock", action="store_true", help="time steps in wall time, not thread CPU time")
    args = parser.parse_args()
    if not args.wall_clock and args.threads != 1:
        raise SystemExit("thread CPU time counts one thread: use --threads 1, or --wall-clock")
    clock = time.perf_counter if args.wall_clock else time.thread_time
    torch.set_num_threads(args.threads)
    engine = LLMEngine(EngineConfig(model_dir=pull(args.model, progress=False), device="cpu", dtype="float32",
                                    kv_cache_bytes=KV_CACHE_BYTES, speculation=SpeculationConfig(max_verify_rows_per_step=args.max_rows)))
    print(f"  {engine.backend.describe()}", flush=True)
    proposer = engine.proposer = RejectedDrafts()
    prompt = [(i * 7919) % 40000 + 100 for i in range(args.context)]  # fixed, no repeats to copy
    num_steps = args.repeats * args.max_rows * args.max_rows + 2  # room even if every draft were accepted
    request = engine.add_request("row-costs", prompt, SamplingParams(max_tokens=num_steps, temperature=0.0,
                                                                     ignore_eos=True))
    while request.status is not RequestStatus.RUNNING or not request.output_token_ids:
        engine.step()
    best = [float("inf")] * args.max_rows
    for _ in range(args.repeats):
        for rows in range(1, args.max_rows + 1):
            proposer.num_drafts = rows - 1
            started = clock()
            engine.step()
            best[rows - 1] = min(best[rows - 1], clock() - started)
    print(f"  1-row step {best[0] * 1e3:.2f} ms, context {args.context}")
    print("verify_row_costs", tuple(round(seconds / best[0], 2) for seconds in best))


if __name__ == "__main__":
    main()

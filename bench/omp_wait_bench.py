"""Batch-1 decode tokens/s under OpenMP wait policies, side by side in one run (server/omp_wait_policy.py).

    nice .venv/bin/python -m bench.omp_wait_bench [--model NAME|PATH] [--policies unset,passive,spin:20000]
        [--tokens 48] [--rounds 3]

The kernels and torch's ops share one OpenMP runtime (torch's libgomp). Its threads wait between
parallel regions by spinning (300,000 spins when OMP_WAIT_POLICY is unset, then a futex) or, with
OMP_WAIT_POLICY=PASSIVE, by sleeping at once. The policy is read once, when the runtime loads, so
each policy runs in a process of its own (this module with --child): the engine built and stepped on
one thread, as the server's engine thread does, one warm-up request, then one greedy request of
--tokens tokens (ignore_eos) timed from its first token. Policies alternate round by round; the table
gives each one's median and its ratio to the first policy's. `unset` clears both variables,
`passive` sets OMP_WAIT_POLICY=PASSIVE, `active` OMP_WAIT_POLICY=ACTIVE, `spin:N` GOMP_SPINCOUNT=N.
The prompt is 32 random tokens; the prefix cache is on but every request's prompt is new.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

PROMPT_TOKENS = 32
POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def policy_environment(policy: str) -> dict[str, str]:
    """The process environment for `policy` (unset | passive | active | spin:N)."""
    env = {k: v for k, v in os.environ.items() if k not in POLICY_VARIABLES}
    if policy in ("passive", "active"):
        env["OMP_WAIT_POLICY"] = policy.upper()
    elif policy.startswith("spin:") and policy[5:].isdigit():
        env["GOMP_SPINCOUNT"] = policy[5:]
    elif policy != "unset":
        raise ValueError(f"unknown policy {policy!r}: unset, passive, active or spin:N")
    return env


def _child(model: str, tokens: int, seed: int) -> None:
    from engine.engine_config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams
    from store.model_store import pull

    engine = LLMEngine(EngineConfig(model_dir=pull(model, progress=False), device="cpu", dtype="float32",
                                    kv_cache_bytes=256 << 20))
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    def rate() -> float:
        prompt = [rng.randrange(100, engine.vocab_size) for _ in range(PROMPT_TOKENS)]
        request = engine.add_request(f"r{rng.random()}", prompt, params)
        while not request.output_token_ids:
            engine.step()
        started, done = time.perf_counter(), len(request.output_token_ids)
        while engine.has_unfinished():
            engine.step()
        return (len(request.output_token_ids) - done) / (time.perf_counter() - started)

    rate()  # warm-up: kernels built and loaded, first-call allocations
    print(json.dumps({"tokens_per_s": rate()}))


def run_policy(policy: str, model: str, tokens: int, seed: int) -> float:
    completed = subprocess.run([sys.executable, "-m", "bench.omp_wait_bench", "--child", "--model", model,
                                "--tokens", str(tokens), "--seed", str(seed)],
                               env=policy_environment(policy), capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"policy {policy} failed:\n{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])["tokens_per_s"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--policies", default="unset,passive")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.model, args.tokens, args.seed)
        return 0
    policies = args.policies.split(",")
    for policy in policies:
        policy_environment(policy)  # a bad name fails before any run
    rates: dict[str, list[float]] = {policy: [] for policy in policies}
    for round_index in range(args.rounds):
        for policy in policies:
            rates[policy].append(run_policy(policy, args.model, args.tokens, args.seed + round_index))
            print(f"round {round_index + 1} {policy}: {rates[policy][-1]:.2f} tok/s "
                  f"(load {os.getloadavg()[0]:.2f})", file=sys.stderr)
    reference = statistics.median(rates[policies[0]])
    print(f"| policy | decode tok/s, median of {args.rounds} | runs | ratio to {policies[0]} |")
    print("|---|---:|---|---:|")
    for policy in policies:
        median = statistics.median(rates[policy])
        runs = ", ".join(f"{rate:.1f}" for rate in rates[policy])
        print(f"| {policy} | {median:.2f} | {runs} | {median / reference:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Prefix-cache hit rate of real tool-calling agent loops: N concurrent sessions x T turns.

    .venv/bin/python -m bench.agent_tool_loop [--url URL --api-key KEY] [--num-sessions 8] [--num-turns 5]

Every session shares one system prompt and the six tools of bench/agent_tools.py
(sent as OpenAI `tools`); each turn forces a tool call (`tool_choice: required`),
appends the assistant message as returned (with its `tool_calls`) and one `tool`
message per call, and goes on. The cached share per turn is
`usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens`; the best any
cache can do at turn t > 1 is the previous turn's prompt + completion (what the
server has seen), which is printed beside it. Without --url it starts radixserve
on a free port (pass server flags after `--`, e.g. `-- --no-prefix-cache`).
"""

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass

import httpx

from bench import corpus
from bench.agent_tools import TOOLS
from bench.agent_workload import AGENT_INSTRUCTIONS, TASKS
from bench.local_server import ServerStartError, radixserve_server
from bench.runner import RunOptions, open_client


@dataclass(frozen=True)
class TurnUsage:
    session: int
    turn: int
    num_prompt_tokens: int
    num_cached_tokens: int
    num_completion_tokens: int
    num_tool_calls: int
    latency_s: float


async def _session(client: httpx.AsyncClient, index: int, model: str | None, args) -> list[TurnUsage]:
    rng = random.Random(args.seed * 1000 + index)
    vocabulary = corpus.words()
    task = rng.choice(TASKS).format(a=rng.choice(vocabulary), b=rng.choice(vocabulary))
    messages = [{"role": "system", "content": AGENT_INSTRUCTIONS}, {"role": "user", "content": task}]
    usages = []
    for turn in range(args.num_turns):
        body = {"messages": messages, "tools": list(TOOLS), "tool_choice": "required", "parallel_tool_calls": False,
                "max_tokens": args.max_tokens, "temperature": 0}
        if model:
            body["model"] = model
        started = time.perf_counter()
        response = await client.post("/v1/chat/completions", json=body)
        latency_s = time.perf_counter() - started
        if response.status_code != 200:
            raise RuntimeError(f"session {index} turn {turn}: HTTP {response.status_code}: {response.text[:300]}")
        answer = response.json()
        usage, message = answer["usage"], answer["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        usages.append(TurnUsage(index, turn, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"],
                                usage["completion_tokens"], len(calls), latency_s))
        messages.append({key: value for key, value in message.items() if value is not None})
        for call in calls:
            passage = " ".join(rng.choice(corpus.paragraphs()).split()[:args.tool_result_words])
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": json.dumps({"status": "ok", "output": passage})})
        if not calls:
            messages.append({"role": "user", "content": "Go on: call the next tool."})
    return usages


async def run(url: str, api_key: str | None, args) -> list[TurnUsage]:
    options = RunOptions(concurrency=args.num_sessions, api_key=api_key, timeout_s=600)
    async with open_client(url.rstrip("/"), options) as client:
        sessions = [_session(client, i, args.model, args) for i in range(args.num_sessions)]
        return [usage for usages in await asyncio.gather(*sessions) for usage in usages]


def report(usages: list[TurnUsage], num_turns: int) -> str:
    by_key = {(u.session, u.turn): u for u in usages}
    lines = ["| turn | prompt tokens (mean) | cached share | best possible share | tool calls |",
             "|---|---|---|---|---|"]
    for turn in range(num_turns):
        turn_usages = [u for u in usages if u.turn == turn]
        num_prompt = sum(u.num_prompt_tokens for u in turn_usages)
        num_cached = sum(u.num_cached_tokens for u in turn_usages)
        seen = [by_key[(u.session, turn - 1)] for u in turn_usages] if turn else []
        best = sum(min(p.num_prompt_tokens + p.num_completion_tokens, u.num_prompt_tokens)
                   for p, u in zip(seen, turn_usages)) / num_prompt if turn else 0.0
        lines.append(f"| {turn + 1} | {num_prompt / len(turn_usages):.0f} | {num_cached / num_prompt:.3f} | "
                     f"{best:.3f} | {sum(u.num_tool_calls for u in turn_usages)} |")
    num_prompt = sum(u.num_prompt_tokens for u in usages)
    num_cached = sum(u.num_cached_tokens for u in usages)
    lines.append(f"\nall turns: {num_cached} of {num_prompt} prompt tokens cached = **{num_cached / num_prompt:.3f}**")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an OpenAI-compatible server (default: start radixserve)")
    parser.add_argument("--api-key")
    parser.add_argument("--model", help="model name to send (default: none, the server's)")
    parser.add_argument("--num-sessions", type=int, default=8)
    parser.add_argument("--num-turns", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--tool-result-words", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("server_args", nargs="*", help="after --: flags for `radixserve serve`")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        if args.url:
            usages = asyncio.run(run(args.url, args.api_key, args))
        else:
            with radixserve_server(args.server_args) as url:
                usages = asyncio.run(run(url, None, args))
    except (ServerStartError, httpx.TransportError, RuntimeError) as error:
        print(f"agent_tool_loop: error: {error}", file=sys.stderr)
        return 1
    print(f"{args.num_sessions} sessions x {args.num_turns} turns, 6 tools, tool_choice required "
          f"({time.perf_counter() - started:.0f} s)\n")
    print(report(usages, args.num_turns))
    return 0


if __name__ == "__main__":
    sys.exit(main())

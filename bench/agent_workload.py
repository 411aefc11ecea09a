"""Agent sessions: N sessions x T turns over a shared system prompt with six tool definitions.

Each turn appends the model's real reply as an assistant message and a synthetic tool
result as a user message ("Tool result: {...}"), so turn t+1's prompt extends turn t's
prompt + reply: a prefix cache serves everything but the newest tool result and reply.
By default the tools are text in the system prompt (the same bytes to every server);
`native_tools=True` sends them as OpenAI `tools` instead.
"""

import json
import random

from bench import corpus
from bench.agent_tools import TOOL_NAMES, TOOLS, tools_as_text
from bench.workload import ChatRequest, Message, Session, Workload
from bench.workload_sizes import WorkloadSizes

AGENT_INSTRUCTIONS = (
    "You are a careful software engineering agent working in a Python project. Work step by step: "
    "think about what you need, call one tool at a time, read its result, and continue until the task "
    "is done. When the task is done, answer with a short summary of what you changed and why. "
    "Never invent file contents or tool results; if a tool fails, say so and try another approach."
)
TASKS = (
    "Find out how {a} and {b} interact in the standard library and write a short note about it.",
    "Write a small helper that uses {a} to handle {b}, with a test.",
    "Explain why our code that combines {a} with {b} fails, and fix it.",
    "Document the module that deals with {a}; mention {b} where it matters.",
)


def system_prompt(native_tools: bool) -> str:
    return AGENT_INSTRUCTIONS if native_tools else AGENT_INSTRUCTIONS + "\n\n" + tools_as_text()


class AgentSession(Session):
    def __init__(self, rng: random.Random, sizes: WorkloadSizes, native_tools: bool):
        self.num_turns = sizes.agent_num_turns
        self._rng = rng
        self._sizes = sizes
        self._tools = TOOLS if native_tools else ()
        vocabulary = corpus.words()
        task = rng.choice(TASKS).format(a=rng.choice(vocabulary), b=rng.choice(vocabulary))
        self._messages: list[Message] = [{"role": "system", "content": system_prompt(native_tools)},
                                         {"role": "user", "content": task}]
        self._num_replies = 0
        self._first = self._request()

    def _request(self) -> ChatRequest:
        return ChatRequest(tuple(self._messages), self._sizes.max_tokens, self._tools)

    def _tool_result(self) -> str:
        passage = self._rng.choice(corpus.paragraphs()).split()[: self._sizes.agent_tool_result_words]
        result = {"tool": self._rng.choice(TOOL_NAMES), "status": "ok", "output": " ".join(passage)}
        return "Tool result: " + json.dumps(result)

    def first_request(self) -> ChatRequest:
        return self._first

    def next_request(self, reply_text: str) -> ChatRequest | None:
        self._num_replies += 1
        if self._num_replies >= self.num_turns:
            return None
        self._messages += [{"role": "assistant", "content": reply_text},
                           {"role": "user", "content": self._tool_result()}]
        return self._request()


def agent_workload(sizes: WorkloadSizes, seed: int, native_tools: bool = False) -> Workload:
    # One generator per session: a session's tool results do not depend on how the
    # sessions' turns interleave at run time.
    sessions = [AgentSession(random.Random(f"{seed}-agent-{i}"), sizes, native_tools)
                for i in range(sizes.agent_num_sessions)]
    mode = "native tools" if native_tools else "tools as text"
    return Workload("agent", f"{sizes.agent_num_sessions} sessions x {sizes.agent_num_turns} turns, "
                    f"shared system prompt with 6 tools ({mode})", sessions)

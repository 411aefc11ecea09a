"""What a workload is: named sessions, each a chain of chat requests.

A single-turn request is a session of one. A multi-turn session (the agent) builds turn t+1
from turn t's real reply, so a session is stateful: build a fresh workload for every run.
Every request is plain OpenAI chat JSON, the same bytes to every server.
"""

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, str]  # {"role": ..., "content": ...}


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[Message, ...]
    max_tokens: int
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI `tools`; empty: not sent
    extra_body: dict[str, Any] | None = None  # more fields for the body (a server's extensions)


class Session(ABC):
    """A chain of requests sent one after another; the runner feeds each reply back."""

    num_turns: int  # requests the session sends when none fails

    @abstractmethod
    def first_request(self) -> ChatRequest:
        """The session's first request; no side effects (may be called more than once)."""

    @abstractmethod
    def next_request(self, reply_text: str) -> ChatRequest | None:
        """The request after the one whose reply is `reply_text`, or None when the session is done."""


class SingleRequest(Session):
    num_turns = 1

    def __init__(self, request: ChatRequest):
        self.request = request

    def first_request(self) -> ChatRequest:
        return self.request

    def next_request(self, reply_text: str) -> ChatRequest | None:
        return None


@dataclass(frozen=True)
class Workload:
    name: str
    description: str  # one line for reports: sizes and sharing
    sessions: Sequence[Session]

    @property
    def num_requests(self) -> int:
        return sum(s.num_turns for s in self.sessions)

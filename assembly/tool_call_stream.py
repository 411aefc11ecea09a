"""Tool calls parsed out of an assistant turn as its text streams in.

`ToolCallStreamParser.push(text)` returns the content to show and the
tool-call deltas in OpenAI's streaming shape: a call's first delta carries its
index, id and name, the next ones fragments of its arguments. A finished turn
is parsed by feeding its whole text at once (`parse_tool_calls`), so a streamed
turn and a non-streamed one give the very same calls.

Rules (Hermes format, see tool_calls.py):
- text outside `<tool_call>...</tool_call>` blocks is content. A suffix that
  may still become `<tool_call>` is held back; so is trailing whitespace, which
  is dropped if a call follows and emitted otherwise.
- a block becomes a call once its name is known and its arguments value has
  begun as an object: `{"name": "...", "arguments": {` (name first, as the
  format and the constrained grammar write it). The arguments' characters are
  streamed as they come, up to the end of that object (tracked by bracket
  depth outside strings), so they are the exact JSON text the model wrote.
- a block in another shape is judged when it closes: a valid call (arguments
  last, or given as a JSON string) is emitted whole; anything else becomes
  content, tags included, so nothing is lost.
- the closing tag ends a block only outside the JSON strings of its body: a
  `</tool_call>` written inside an argument's string value is part of it.
- a call whose arguments object never ended (the turn cut by max_tokens, or the
  block closed mid-object) is not a call: its deltas were streamed, but it is
  not in `calls` (a non-streamed answer leaves it out; the turn's
  finish_reason, "length" when cut, says why), and `num_unfinished_calls`
  counts it.
"""

import json
import re
from dataclasses import dataclass

from assembly.tool_calls import CALL_CLOSE, CALL_OPEN, ToolCall, new_tool_call_id, parse_call_body

_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


@dataclass(frozen=True)
class ToolCallDelta:
    index: int  # of the call in this turn
    id: str | None = None  # first delta of a call only
    name: str | None = None  # first delta of a call only
    arguments: str = ""  # a fragment of the arguments JSON

    def to_openai(self) -> dict:
        delta: dict = {"index": self.index}
        if self.id is not None:
            delta.update(id=self.id, type="function", function={"name": self.name, "arguments": self.arguments})
        else:
            delta["function"] = {"arguments": self.arguments}
        return delta


@dataclass
class _OpenCall:
    body: str = ""  # text after <tool_call>, up to what is known not to be the closing tag
    index: int | None = None  # set once the call is announced
    id: str | None = None
    name: str | None = None
    arguments: str = ""  # streamed so far
    scan_at: int | None = None  # body offset where the arguments scan continues
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    arguments_done: bool = False
    # Where the closing tag may be: only outside the body's JSON strings (state of the body read so far).
    body_is_json: bool | None = None  # decided by the body's first non-space character: "{"
    body_in_string: bool = False
    body_escaped: bool = False


class ToolCallStreamParser:
    def __init__(self, call_id_prefix: str = "call_"):
        self.call_id_prefix = call_id_prefix  # the API's id style: "call_" (OpenAI), "toolu_" (Anthropic)
        self._pending = ""  # text not yet classified
        self._held_space = ""  # content whitespace held back
        self._call: _OpenCall | None = None
        self.calls: list[ToolCall] = []  # complete calls only
        self.num_unfinished_calls = 0  # announced (deltas sent) but their arguments never ended

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """More of the turn's text -> (content to emit, tool-call deltas)."""
        self._pending += text
        content, deltas = [], []
        while self._pending:
            before = len(self._pending), self._call is None
            if self._call is None:
                content.append(self._take_content())
            else:
                call_content, call_deltas = self._take_call()
                content.append(call_content)
                deltas.extend(call_deltas)
            if (len(self._pending), self._call is None) == before:
                break  # waiting for more text
        return "".join(content), _merged(deltas)

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """The turn ended: flush what was held back; an open call keeps what it streamed."""
        content, deltas = [], []
        if self._call is not None:
            call, self._call = self._call, None
            call.body += self._pending
            self._pending = ""
            if call.index is not None:
                self._record(call)  # complete only if its arguments ended before the turn did
            else:
                content.append(self._settle(call, closed=False, deltas=deltas))
        else:
            content.append(self._pending)
            self._pending = ""
        if not self.calls:
            content.insert(0, self._held_space)
        self._held_space = ""
        return "".join(content), deltas

    # ---- content --------------------------------------------------------

    def _take_content(self) -> str:
        text = self._pending
        open_at = text.find(CALL_OPEN)
        if open_at >= 0:
            # Whitespace just before the block stays held: dropped if it is a call.
            self._pending = text[open_at + len(CALL_OPEN):]
            self._call = _OpenCall()
            return self._emit_content(text[:open_at])
        num_held = _partial_suffix(text, CALL_OPEN)
        self._pending = text[len(text) - num_held:] if num_held else ""
        return self._emit_content(text[:len(text) - num_held])

    def _emit_content(self, text: str) -> str:
        """Content with trailing whitespace held back until something follows it."""
        text = self._held_space + text
        stripped = text.rstrip()
        self._held_space = text[len(stripped):]
        return stripped

    # ---- calls ----------------------------------------------------------

    def _take_call(self) -> tuple[str, list[ToolCallDelta]]:
        call = self._call
        text = self._pending
        close_at, num_body = _find_close(call, text)
        call.body += text[:num_body]
        self._pending = text[close_at + len(CALL_CLOSE):] if close_at >= 0 else text[num_body:]
        deltas = self._stream_arguments(call)
        content = ""
        if close_at >= 0:
            self._call = None
            if call.index is not None:
                self._record(call)
            else:
                content = self._settle(call, closed=True, deltas=deltas)
        return content, deltas

    def _stream_arguments(self, call: _OpenCall) -> list[ToolCallDelta]:
        deltas = []
        if call.index is None:
            head = _CALL_HEAD.match(call.body)
            if head is None or len(call.body) <= head.end():
                return deltas
            if call.body[head.end()] != "{":
                return deltas  # arguments as a string or other: judged when the block closes
            call.index, call.id = len(self.calls), new_tool_call_id(self.call_id_prefix)
            call.name = json.loads(f'"{head.group(1)}"')
            call.scan_at = head.end()
            deltas.append(ToolCallDelta(call.index, call.id, call.name))
        if call.arguments_done:
            return deltas
        fragment = self._scan(call)
        if fragment:
            call.arguments += fragment
            deltas.append(ToolCallDelta(call.index, arguments=fragment))
        return deltas

    @staticmethod
    def _scan(call: _OpenCall) -> str:
        """Advance through the arguments object; return the characters that belong to it."""
        start = call.scan_at
        i = start
        body = call.body
        while i < len(body):
            char = body[i]
            i += 1
            if call.in_string:
                if call.escaped:
                    call.escaped = False
                elif char == "\\":
                    call.escaped = True
                elif char == '"':
                    call.in_string = False
            elif char == '"':
                call.in_string = True
            elif char in "{[":
                call.depth += 1
            elif char in "}]":
                call.depth -= 1
                if call.depth == 0:
                    call.arguments_done = True
                    break
        call.scan_at = i
        return body[start:i]

    def _settle(self, call: _OpenCall, closed: bool, deltas: list[ToolCallDelta]) -> str:
        """A block that was never announced: a whole valid call, or content (returned)."""
        parsed = parse_call_body(call.body) if closed else None
        if parsed is None:  # not a call: the block's text is content, with the whitespace held before it
            text, self._held_space = self._held_space + CALL_OPEN + call.body + (CALL_CLOSE if closed else ""), ""
            return text
        call.index, call.id = len(self.calls), new_tool_call_id(self.call_id_prefix)
        call.name, call.arguments = parsed
        deltas.append(ToolCallDelta(call.index, call.id, call.name, call.arguments))
        self._record(call)
        return ""

    def _record(self, call: _OpenCall) -> None:
        """An announced call ends: a call if its arguments object ended (or it was judged whole),
        else unfinished (cut by max_tokens, or closed mid-object): never presented as a call."""
        if call.arguments_done or call.scan_at is None:
            self.calls.append(ToolCall(call.id, call.name, call.arguments))
        else:
            self.num_unfinished_calls += 1
        self._held_space = ""  # whitespace between calls is not content


def _merged(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Adjacent deltas of one call as one (a call's start and its first fragment travel together)."""
    merged: list[ToolCallDelta] = []
    for delta in deltas:
        if merged and merged[-1].index == delta.index and delta.id is None:
            last = merged[-1]
            merged[-1] = ToolCallDelta(last.index, last.id, last.name, last.arguments + delta.arguments)
        else:
            merged.append(delta)
    return merged


def _find_close(call: _OpenCall, text: str) -> tuple[int, int]:
    """Where `text` (more of `call`'s body) closes the call: (offset of a closing tag outside the
    body's JSON strings or -1, number of characters that are surely body). Advances the string state
    over those characters; a suffix that may begin the tag is held back."""
    is_json, in_string, escaped = call.body_is_json, call.body_in_string, call.body_escaped
    i = 0
    while i < len(text):
        char = text[i]
        if is_json is None and not char.isspace():
            is_json = char == "{"
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == "<" and text.startswith(CALL_CLOSE, i):
            break
        elif char == "<" and CALL_CLOSE.startswith(text[i:]):
            call.body_is_json, call.body_in_string, call.body_escaped = is_json, in_string, escaped
            return -1, i  # may be the tag: wait for more
        elif char == '"' and is_json:
            in_string = True
        i += 1
    call.body_is_json, call.body_in_string, call.body_escaped = is_json, in_string, escaped
    return (i if i < len(text) else -1), i


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """A finished turn's text -> (content or None when blank, calls), as the stream parser sees it."""
    parser = ToolCallStreamParser()
    content, _ = parser.push(text)
    tail, _ = parser.finish()
    content += tail
    return (content if content.strip() else None), parser.calls

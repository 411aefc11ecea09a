"""Tool calls in the Hermes format, and parsing them out of a finished assistant turn.

The model writes each call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

optionally after some text. A call's `arguments` is handed to clients as the
JSON text the model wrote for it (OpenAI's arguments are a JSON string).
Parsing a turn, streamed or whole, is tool_call_stream.py's job.
"""

import json
import uuid
from dataclasses import dataclass

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    id: str  # "call_..."
    name: str
    arguments: str  # a JSON object, as text

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def message_content(text: str, calls: list[ToolCall]) -> str | None:
    """A turn's `message.content`, as OpenAI shapes it: None for a turn of tool calls only."""
    return None if calls and not text.strip() else text


def new_tool_call_id(prefix: str = "call_") -> str:
    """OpenAI's "call_..." by default; Anthropic's Messages API names its calls "toolu_..."."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def parse_call_body(body: str) -> tuple[str, str] | None:
    """The JSON between the tags -> (name, arguments JSON text), or None when it is not a call.

    The arguments text is the raw slice the model wrote when it wrote an object,
    or the string's value when it wrote the arguments as a JSON string."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            if not isinstance(json.loads(arguments), dict):
                return None
        except json.JSONDecodeError:
            return None
        return call["name"], arguments
    if not isinstance(arguments, dict):
        return None
    raw = raw_arguments_slice(body)
    return call["name"], raw if raw is not None else json.dumps(arguments, ensure_ascii=False)


def raw_arguments_slice(body: str) -> str | None:
    """The exact text of the top-level "arguments" value in a JSON object's text, if it is an object."""
    decoder = json.JSONDecoder()
    i = body.index("{") + 1
    while i < len(body):
        while i < len(body) and body[i] in " \t\r\n,":
            i += 1
        if i >= len(body) or body[i] != '"':
            return None
        key, i = json.decoder.scanstring(body, i + 1)
        while i < len(body) and body[i] in " \t\r\n:":
            i += 1
        value, end = decoder.raw_decode(body, i)
        if key == "arguments":
            return body[i:end] if isinstance(value, dict) else None
        i = end
    return None

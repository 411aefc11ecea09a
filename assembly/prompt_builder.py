"""Chat messages, tools and documents -> the prompt's token ids, laid out for the prefix cache.

Layout: stable parts first. The system turn, then the tools, then the
documents, then the history and the new question. A template that renders
`tools` / `documents` itself places them; for one that does not (SmolLM2's),
the built-in blocks are appended to the system turn in that order, assistant
tool calls are written in the Hermes format and tool results become
`<tool_response>` user turns, so the template only sees plain messages.

Rendered once, then tokenized with the segment cache. Assistant turns this
server generated (found in GeneratedTurns) are rendered as a sentinel and
replaced by their generated token ids, so the next turn's prompt starts with
exactly the tokens the engine cached for the previous one (prompt +
generated). If the template does not reproduce a sentinel verbatim, the prompt
is rendered again without splicing: correct, but without that guarantee.

Everything a request sends (messages, tools, documents, chat_template_kwargs,
keys and values alike) goes through `SegmentTokenizer.as_text` before it is
rendered, so an added token's string in it is tokenized as text: only the
template's and the built-in blocks' own markup yields control tokens.
"""

import json
import re
from collections.abc import Sequence
from itertools import groupby
from typing import Any

from assembly.builtin_blocks import BuiltinBlocks
from assembly.chat_template import ChatTemplate, TemplateError
from assembly.generated_turns import GeneratedTurns
from assembly.segment_tokenizer import SegmentTokenizer

_SENTINEL = "\ue000{}\ue001"  # private-use characters around the splice's index
_SENTINEL_PATTERN = re.compile("\ue000(\\d+)\ue001")


class PromptBuilder:
    def __init__(self, tokenizer: SegmentTokenizer, template: ChatTemplate, turns: GeneratedTurns | None = None):
        self.tokenizer = tokenizer
        self.template = template
        self.turns = turns
        self.blocks = BuiltinBlocks()

    def render(self, messages: Sequence[dict], *, tools: list[dict] | None = None,
               documents: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None,
               add_generation_prompt: bool = True) -> str:
        """The prompt's text, without splicing. Raises TemplateError."""
        return self.tokenizer.unmarked(self._render_marked(list(messages), tools, documents, template_kwargs,
                                                           add_generation_prompt))

    def _render_marked(self, messages, tools, documents, template_kwargs, add_generation_prompt) -> str:
        """The prompt's text with the request's values marked as text (see module doc). Tool-call
        arguments are parsed first: a JSON escape (`\\u003c`) must not unmark what it spells."""
        messages = [{**message, "tool_calls": _parsed_calls(message["tool_calls"], index)}
                    if message.get("role") == "assistant" and message.get("tool_calls") else message
                    for index, message in enumerate(messages)]
        messages, tools, documents, template_kwargs = self._as_text([messages, tools, documents, template_kwargs])
        prepared = self._prepare(messages, tools, documents)
        return self._render(prepared, tools, documents, template_kwargs, add_generation_prompt)

    def _as_text(self, value):
        """`value` (JSON-shaped) with every string in it, keys included, marked as text."""
        if isinstance(value, str):
            return self.tokenizer.as_text(value)
        if isinstance(value, dict):
            return {self._as_text(k): self._as_text(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._as_text(v) for v in value]
        return value

    def build(self, messages: Sequence[dict], *, tools: list[dict] | None = None,
              documents: list[dict] | None = None, template_kwargs: dict[str, Any] | None = None,
              add_generation_prompt: bool = True, max_num_tokens: int | None = None,
              turn_scope: str = "", use_cache: bool = True) -> list[int]:
        """The prompt's token ids, with the assistant turns remembered in `turn_scope` spliced in.
        Raises TemplateError for messages the template refuses, and PromptTooLong when the rendered
        text cannot fit `max_num_tokens` (checked before tokenizing). `use_cache` False: a one-off
        prompt that leaves the segment cache as it is."""
        messages = list(messages)
        spliced: list[list[int]] = []
        with_sentinels = []
        for message in messages:
            is_assistant = message.get("role") == "assistant"
            ids = self.turns.lookup(message, turn_scope) if self.turns is not None and is_assistant else None
            if ids is None:
                with_sentinels.append(message)
            else:
                with_sentinels.append({"role": "assistant", "content": _SENTINEL.format(len(spliced))})
                spliced.append(ids)
        if spliced:
            text = self._render_marked(with_sentinels, tools, documents, template_kwargs, add_generation_prompt)
            pieces = _splice(text, spliced)
            if pieces is not None:
                self.tokenizer.check_fits(pieces, max_num_tokens)
                return self.tokenizer.encode_pieces(pieces)
        text = self._render_marked(messages, tools, documents, template_kwargs, add_generation_prompt)
        self.tokenizer.check_fits([text], max_num_tokens)
        return self.tokenizer.encode(text, use_cache=use_cache)

    # ---- messages the template can render ---------------------------------

    def _prepare(self, messages: list[dict], tools: list[dict] | None, documents: list[dict] | None) -> list[dict]:
        native_tools = self.template.supports_tools
        prepared: list[dict] = []
        # Runs of tool results become one user turn for a template that cannot render them.
        runs = groupby(enumerate(messages), key=lambda item: item[1].get("role") == "tool" and not native_tools)
        for is_tool_results, run in runs:
            if is_tool_results:
                responses = [message.get("content") or "" for _, message in run]
                prepared.append({"role": "user", "content": self.blocks.tool_responses(responses)})
                continue
            for index, message in run:
                if message.get("role") == "assistant" and message.get("tool_calls"):
                    calls = _parsed_calls(message["tool_calls"], index)
                    if native_tools:
                        message = {**message, "tool_calls": calls}
                    else:
                        content = self.blocks.tool_calls(message.get("content") or "", [c["function"] for c in calls])
                        message = {k: v for k, v in message.items() if k != "tool_calls"} | {"content": content}
                prepared.append(message)
        return self._with_system_blocks(prepared, tools, documents)

    def _with_system_blocks(self, messages: list[dict], tools, documents) -> list[dict]:
        blocks = []
        if tools and not self.template.supports_tools:
            blocks.append(self.blocks.tools(tools))
        if documents and not self.template.supports_documents:
            blocks.append(self.blocks.documents(documents))
        if not blocks:
            return messages
        if messages and messages[0].get("role") == "system":
            system = messages[0]
            return [{**system, "content": "\n\n".join(filter(None, [system.get("content"), *blocks]))}, *messages[1:]]
        return [{"role": "system", "content": "\n\n".join(blocks)}, *messages]

    def _render(self, messages, tools, documents, template_kwargs, add_generation_prompt) -> str:
        return self.template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools if self.template.supports_tools else None,
            documents=documents if self.template.supports_documents else None,
            template_kwargs=template_kwargs,
        )


def _parsed_calls(tool_calls: list, message_index: int) -> list[dict]:
    """OpenAI tool calls with their JSON-string arguments parsed, as templates expect them."""
    calls = []
    for j, call in enumerate(tool_calls):
        where = f"messages[{message_index}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise TemplateError(f"{where} needs a function with a name")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                raise TemplateError(f"{where}.function.arguments is not valid JSON") from None
        calls.append({**call, "type": call.get("type", "function"), "function": {**function, "arguments": arguments}})
    return calls


def _splice(text: str, spliced: list[list[int]]) -> list[str | list[int]] | None:
    """Rendered text with sentinels -> text and id pieces; None unless each sentinel appears once."""
    if text.count("\ue000") != len(spliced):  # a sentinel lost, repeated, or forged by a message
        return None
    pieces: list[str | list[int]] = []
    seen = set()
    position = 0
    for match in _SENTINEL_PATTERN.finditer(text):
        index = int(match.group(1))
        if index >= len(spliced) or index in seen:
            return None
        seen.add(index)
        pieces.append(text[position:match.start()])
        pieces.append(spliced[index])
        position = match.end()
    if len(seen) != len(spliced):
        return None
    pieces.append(text[position:])
    return pieces

"""Grammar-constrained output with llguidance: forced tool calls and JSON responses.

A grammar becomes a token mask at every decode step: a logits processor
(generated ids, logits (V,)) -> logits with every token the grammar cannot
take next set to -inf. Once the grammar is complete only end-of-turn tokens
remain, so the turn ends right after it.

Grammars:
- a forced tool call (tool_choice named, or required): the assistant turn is
  `<tool_call>\\n{"name": <one of the tools>, "arguments": <that tool's
  parameters schema>}\\n</tool_call>`, one call or (parallel) several on
  separate lines. The opening tag is forced by the mask like any other text.
- calls the model may choose to make (tool_choice auto): text is free until the
  model writes `<tool_call>` (a lazy lexeme, llguidance's StructTag), then the
  call must be one of the tools with arguments that fit its schema.
- response_format json_object (any object) / json_schema (the given schema).

JSON is written with fixed separators (", " and ": ") and no free whitespace,
so a small model cannot wander off into blank lines inside a value.
"""

import json
import threading
from pathlib import Path

import llguidance
import torch
from torch import Tensor

from assembly.tool_calls import CALL_CLOSE, CALL_OPEN

_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A schema or grammar that cannot be compiled (the request's fault)."""


def _json_rule(schema: dict) -> str:
    return "%json " + _dumps({**schema, "x-guidance": _JSON_STYLE})


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _lark_string(text: str) -> str:
    return _dumps(text)  # a JSON string literal is a valid lark string literal


def tool_call_grammar(tools: list[dict], parallel: bool) -> str:
    """Lark grammar: one call (or several, when `parallel`) to one of `tools` ([{"name", "parameters"?}])."""
    if not tools:
        raise GrammarError("a forced tool call needs at least one tool")
    rules = []
    for i, tool in enumerate(tools):
        # The call's JSON around the arguments is literal text; the arguments are their own %json
        # rule, so the parameters stay a root schema and their "#/$defs/..." pointers resolve.
        head = _lark_string('{"name": ' + _dumps(tool["name"]) + ', "arguments": ')
        rules.append(f'body_{i}: {head} arguments_{i} "}}"')
        rules.append(f"arguments_{i}: {_json_rule(tool.get('parameters') or {'type': 'object'})}")
    bodies = " | ".join(f"body_{i}" for i in range(len(tools)))
    opening, closing = _lark_string(CALL_OPEN + "\n"), _lark_string("\n" + CALL_CLOSE)
    start = 'start: call ("\\n" call)*' if parallel else "start: call"
    return "\n".join([start, f"call: {opening} body {closing}", f"body: {bodies}", *rules])


def optional_tool_calls_grammar(tools: list[dict]) -> str:
    """Grammar of free text in which every `<tool_call>` block is a valid call to one of `tools`."""
    if not tools:
        raise GrammarError("tool calls need at least one tool")
    tags = [llguidance.StructTag(trigger=CALL_OPEN,
                                 begin=CALL_OPEN + "\n" + '{"name": ' + json.dumps(tool["name"]) + ', "arguments": ',
                                 grammar={**(tool.get("parameters") or {"type": "object"}), "x-guidance": _JSON_STYLE},
                                 end="}\n" + CALL_CLOSE)
            for tool in tools]
    return llguidance.StructTag.to_grammar(tags, assume_special=False)


def json_grammar(schema: dict | None) -> str:
    """Lark grammar: a JSON value of `schema`, or any JSON object when None."""
    return "start: json\njson: " + _json_rule(schema if schema is not None else {"type": "object"})


class GrammarCompiler:
    """The tokenizer llguidance needs, built once per model on the first grammar (~0.3 s; a 128k
    vocabulary's holds ~60 MiB, which a server that is never asked for a grammar does not need);
    grammars checked and compiled per request."""

    def __init__(self, tokenizer_json: Path, eos_token_ids: list[int], vocab_size: int):
        self.vocab_size = vocab_size
        self._tokenizer_json = Path(tokenizer_json)
        self._eos_token_ids = sorted(eos_token_ids)
        self._built: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()  # check() runs on the event loop, processor() on worker threads

    @property
    def _tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._built is None:
                self._built = llguidance.LLTokenizer(self._tokenizer_json.read_text(), n_vocab=self.vocab_size,
                                                     eos_token=self._eos_token_ids)
            return self._built

    def check(self, lark: str) -> str:
        """The grammar in llguidance's form; raises GrammarError naming what is wrong.
        `lark` is a Lark grammar, or llguidance's JSON form of several (what StructTag makes)."""
        grammar = lark if lark.startswith("{") else llguidance.LLMatcher.grammar_from_lark(lark)
        error = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if error and not error.startswith("WARNING"):
            raise GrammarError(error)
        return grammar

    def processor(self, grammar: str) -> "GrammarLogitsProcessor":
        """A fresh processor for one sequence (each choice of a request needs its own)."""
        return GrammarLogitsProcessor(llguidance.LLMatcher(self._tokenizer, grammar, log_level=0), self.vocab_size,
                                      grammar)


class GrammarLogitsProcessor:
    """One sequence's grammar state. Called by the sampler once per step with all the ids
    generated so far; consumes the new ones, then masks the logits."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, grammar: str):
        self.grammar = grammar  # what it was compiled from: a replica rebuilds it from this (replicas/)
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._num_consumed = 0

    def __call__(self, token_ids: list[int], logits: Tensor) -> Tensor:
        self._consume(token_ids)
        if self._matcher.is_error():
            return logits  # unreachable while the mask is obeyed; never make a step unsampleable
        allowed = torch.frombuffer(bytearray(self._matcher.compute_logit_bias()), dtype=torch.uint8)
        num_masked = min(len(allowed), logits.shape[-1])
        logits[:num_masked].masked_fill_(allowed[:num_masked].to(logits.device) == 0, float("-inf"))
        logits[num_masked:] = float("-inf")
        return logits

    def _consume(self, token_ids: list[int]) -> None:
        for token_id in token_ids[self._num_consumed:]:
            self._matcher.consume_token(token_id)
        self._num_consumed = len(token_ids)

    # Speculative drafts (engine.sampling_params.DraftingLogitsProcessor): what the grammar vouches for.

    def forced_tokens(self, token_ids: list[int]) -> list[int]:
        """The tokens the grammar forces after token_ids (JSON structure, a tool name once its prefix is
        unique): llguidance's fast-forward tokens, the canonical tokenization of the forced bytes."""
        self._consume(token_ids)
        if self._matcher.is_error() or self._matcher.is_stopped():
            return []
        return list(self._matcher.compute_ff_tokens())

    def num_admitted(self, token_ids: list[int], draft_ids: list[int]) -> int:
        """How many of draft_ids, from the first, the grammar admits after token_ids (state unchanged)."""
        self._consume(token_ids)
        if self._matcher.is_error() or not draft_ids:
            return 0
        return self._matcher.validate_tokens(list(draft_ids))

    @property
    def is_complete(self) -> bool:
        return self._matcher.is_accepting()

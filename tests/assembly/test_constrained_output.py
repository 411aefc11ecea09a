"""Grammars as token masks (llguidance) on the real tokenizer: a forced tool call, JSON responses."""

import json

import pytest
import torch

from assembly.constrained_output import GrammarCompiler, GrammarError, json_grammar, tool_call_grammar
from assembly.tool_call_stream import parse_tool_calls

pytestmark = pytest.mark.model

EOS = 2  # SmolLM2's <|im_end|>
WEATHER = {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}
SEARCH = {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}


@pytest.fixture(scope="module")
def compiler(smollm2_dir):
    return GrammarCompiler(smollm2_dir / "tokenizer.json", [EOS], 49152)


def _allowed(processor, generated: list[int]) -> set[int]:
    logits = processor(generated, torch.zeros(49152))
    return set(torch.nonzero(logits > float("-inf")).flatten().tolist())


def _walk(processor, tokenizer, text: str) -> list[int]:
    """Feed `text`'s tokens one by one, checking each is allowed; returns the ids."""
    generated = []
    for token_id in tokenizer.encode(text):
        assert token_id in _allowed(processor, generated), tokenizer.decode(generated + [token_id])
        generated.append(token_id)
    return generated


def test_forced_call_allows_the_call_then_only_the_end(compiler, smollm2_tokenizer):
    processor = compiler.processor(compiler.check(tool_call_grammar([WEATHER], parallel=False)))
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>'
    generated = _walk(processor, smollm2_tokenizer, text)
    assert _allowed(processor, generated) == {EOS}
    assert processor.is_complete
    content, calls = parse_tool_calls(text)
    assert content is None and json.loads(calls[0].arguments) == {"city": "Oslo", "unit": "celsius"}


def test_forced_call_refuses_what_breaks_the_schema(compiler, smollm2_tokenizer):
    grammar = compiler.check(tool_call_grammar([WEATHER], parallel=False))

    def allowed_after(text: str) -> set[str]:
        processor = compiler.processor(grammar)
        ids = _walk(processor, smollm2_tokenizer, text)
        return {smollm2_tokenizer.decode([t]) for t in _allowed(processor, ids)}

    assert all("get_weather".startswith(t) for t in allowed_after('<tool_call>\n{"name": "'))  # the named tool only
    enum_start = allowed_after('<tool_call>\n{"name": "get_weather", "arguments": {"city": "A", "unit": "')
    assert enum_start and all("celsius".startswith(t) or "fahrenheit".startswith(t) for t in enum_start)
    # Fixed separators, no free whitespace: after the key's colon comes exactly " {".
    assert all(t.startswith(" {") for t in allowed_after('<tool_call>\n{"name": "get_weather", "arguments":'))


def test_required_choice_takes_any_tool_and_parallel_calls(compiler, smollm2_tokenizer):
    processor = compiler.processor(compiler.check(tool_call_grammar([WEATHER, SEARCH], parallel=True)))
    text = ('<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "B", "unit": "fahrenheit"}}\n</tool_call>')
    generated = _walk(processor, smollm2_tokenizer, text)
    assert EOS in _allowed(processor, generated)


def test_json_object_and_schema(compiler, smollm2_tokenizer):
    anything = compiler.processor(compiler.check(json_grammar(None)))
    ids = _walk(anything, smollm2_tokenizer, '{"a": [1, 2], "b": {"c": null}}')
    assert _allowed(anything, ids) == {EOS}
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"],
              "additionalProperties": False}
    typed = compiler.processor(compiler.check(json_grammar(schema)))
    ids = _walk(typed, smollm2_tokenizer, '{"age": ')
    assert all(smollm2_tokenizer.decode([t]).lstrip("-").isdigit() or smollm2_tokenizer.decode([t]) == "-"
               for t in _allowed(typed, ids))


@pytest.mark.parametrize("schema", [{"type": "nonsense"}, {"type": "string", "pattern": "(("}])
def test_unusable_schemas_are_refused(compiler, schema):
    with pytest.raises(GrammarError):
        compiler.check(json_grammar(schema))
    with pytest.raises(GrammarError):
        compiler.check(tool_call_grammar([{"name": "f", "parameters": schema}], parallel=False))


def test_optional_calls_leave_text_free_but_make_a_begun_call_valid(compiler, smollm2_tokenizer):
    from assembly.constrained_output import optional_tool_calls_grammar

    grammar = compiler.check(optional_tool_calls_grammar([WEATHER, SEARCH]))
    processor = compiler.processor(grammar)
    generated = _walk(processor, smollm2_tokenizer, "Sure, let me look that up. 3 < 4 and <b>bold</b>.\n")
    assert EOS in _allowed(processor, generated)  # plain text may end the turn
    generated += _walk_more(processor, smollm2_tokenizer, generated, '<tool_call>\n{"name": "')
    names = {smollm2_tokenizer.decode([t]) for t in _allowed(processor, generated)}
    assert names and all("get_weather".startswith(n) or "search".startswith(n) for n in names)
    generated += _walk_more(processor, smollm2_tokenizer, generated,
                            'search", "arguments": {"q": "x"}}\n</tool_call>')
    assert EOS in _allowed(processor, generated)


def _walk_more(processor, tokenizer, generated: list[int], text: str) -> list[int]:
    """Like _walk, continuing after `generated` (text tokenized on its own)."""
    added = []
    for token_id in tokenizer.encode(text):
        assert token_id in _allowed(processor, generated + added), tokenizer.decode(generated + added + [token_id])
        added.append(token_id)
    return added


def _pydantic_tool() -> dict:
    """Parameters as pydantic's model_json_schema() writes them: nested models under $defs, by $ref."""
    from pydantic import BaseModel

    class Address(BaseModel):
        city: str
        zip: str

    class Person(BaseModel):
        name: str
        home: Address
        friends: list["Person"] = []

    return {"name": "add_person", "parameters": Person.model_json_schema()}


def test_forced_calls_take_parameters_with_defs_and_refs(compiler, smollm2_tokenizer):
    tool = _pydantic_tool()
    assert "$defs" in tool["parameters"] and "$ref" in json.dumps(tool["parameters"])
    for parallel in (False, True):
        processor = compiler.processor(compiler.check(tool_call_grammar([tool, SEARCH], parallel=parallel)))
        arguments = ('{"name": "Ann", "home": {"city": "Oslo", "zip": "0150"}, "friends": '
                     '[{"name": "Bo", "home": {"city": "Bergen", "zip": "5003"}, "friends": []}]}')
        text = f'<tool_call>\n{{"name": "add_person", "arguments": {arguments}}}\n</tool_call>'
        generated = _walk(processor, smollm2_tokenizer, text)
        assert EOS in _allowed(processor, generated)
        # The $ref'd Address is enforced: after "home": { only its fields may start.
        probe = compiler.processor(compiler.check(tool_call_grammar([tool], parallel=parallel)))
        ids = _walk(probe, smollm2_tokenizer, '<tool_call>\n{"name": "add_person", "arguments": {"name": "A", '
                                              '"home": {"')
        starts = {smollm2_tokenizer.decode([t]) for t in _allowed(probe, ids)}
        assert starts and all("city".startswith(s) or "zip".startswith(s) for s in starts)


@pytest.mark.parametrize("schema, field", [
    ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, "a"),
    ({"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}, "required": ["next"]}},
      "type": "object", "properties": {"head": {"$ref": "#/$defs/N"}}, "required": ["head"]}, "head.next"),
    ({"type": "object", "properties": {"xs": {"type": "array", "minItems": 1, "items": {"$ref": "#"}}},
      "required": ["xs"]}, "xs[0]"),
    ({"type": "object", "properties": {"e": {"enum": []}}, "required": ["e"]}, "e"),
    (False, ""),
])
def test_schemas_without_a_finite_value_name_the_field(schema, field):
    from assembly.schema_finiteness import unsatisfiable_field

    assert unsatisfiable_field(schema) == field


@pytest.mark.parametrize("schema", [
    _pydantic_tool()["parameters"],  # recursion through an optional list: [] ends it
    {"$defs": {"N": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]}},
                     "required": ["next"]}}, "$ref": "#/$defs/N"},
    {"type": "object", "properties": {"a": {"$ref": "#"}}},  # not required
    {"type": "object", "properties": {"xs": {"type": "array", "items": {"$ref": "#"}}}, "required": ["xs"]},
])
def test_recursive_schemas_with_a_way_out_are_finite(schema):
    from assembly.schema_finiteness import unsatisfiable_field

    assert unsatisfiable_field(schema) is None

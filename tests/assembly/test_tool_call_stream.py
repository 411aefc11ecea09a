"""Tool calls parsed from an assistant turn: whole, and streamed in any chunking (same result)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assembly.tool_call_stream import ToolCallStreamParser, parse_tool_calls

IN_STRING = ('<tool_call>\n{"name": "write", "arguments": {"text": "ends with </tool_call> and \\"</tool_call>\\"", '
             '"n": 1}}\n</tool_call>')
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "tags": ["a}", {"b": "\\"]"}]}}\n</tool_call>'


def _stream(text: str, cuts: list[int]) -> tuple[str | None, list[tuple[str, str, str]]]:
    """Feed `text` cut at `cuts`; reassemble content and calls as an OpenAI streaming client does."""
    parser = ToolCallStreamParser()
    content, calls = "", {}
    bounds = [0, *sorted(set(c % (len(text) + 1) for c in cuts)), len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    for piece in pieces + [None]:
        text_delta, deltas = parser.push(piece) if piece is not None else parser.finish()
        content += text_delta
        for delta in deltas:
            if delta.id is not None:
                assert delta.index == len(calls)  # a call's first delta names it, in order
                calls[delta.index] = [delta.id, delta.name, delta.arguments]
            else:
                calls[delta.index][2] += delta.arguments
    return (content if content.strip() else None), [tuple(c) for _, c in sorted(calls.items())]


@pytest.mark.parametrize("text, content, calls", [
    ("Plain answer.", "Plain answer.", []),
    (CALL, None, [("get_weather", '{"city": "Paris", "tags": ["a}", {"b": "\\"]"}]}')]),
    ("Let me check.\n" + CALL, "Let me check.", [("get_weather", None)]),
    (CALL + "\n" + CALL.replace("get_weather", "other"), None, [("get_weather", None), ("other", None)]),
    ('<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>', None, [("f", '{"x": 1}')]),
    ('<tool_call>{"arguments": {"x": 1}, "name": "z"}</tool_call>', None, [("z", '{"x": 1}')]),
    ("<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    ('<tool_call>\n{"name": "f", "arguments": {"x": 1', None, []),  # cut by max_tokens: not a call
    ('<tool_call>\n{"name": "f", "arguments": {"x": 1\n</tool_call>', None, []),  # closed mid-object
    (IN_STRING, None, [("write", '{"text": "ends with </tool_call> and \\"</tool_call>\\"", "n": 1}')]),
    ('<tool_call>\n{"name": "f", "arguments": "{\\"s\\": \\"</tool_call>\\"}"}\n</tool_call>', None,
     [("f", '{"s": "</tool_call>"}')]),
    ('<tool_call>\nit\'s "quoted </tool_call> after', '<tool_call>\nit\'s "quoted </tool_call> after', []),
    ("x < y, and <tool_ is not a tag  ", "x < y, and <tool_ is not a tag  ", []),
])
def test_whole_turns(text, content, calls):
    parsed_content, parsed_calls = parse_tool_calls(text)
    assert parsed_content == content
    assert [c.name for c in parsed_calls] == [name for name, _ in calls]
    for call, (_, arguments) in zip(parsed_calls, calls):
        assert call.id.startswith("call_")
        if arguments is not None:
            assert call.arguments == arguments


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([
    CALL, "Sure.\n" + CALL, CALL + "\n" + CALL, "no calls <tool at all", "<tool_call>\nbroken\n</tool_call> after",
    '<tool_call>\n{"name": "f", "arguments": "{}"}\n</tool_call>', "text " + CALL + " tail",
    IN_STRING, IN_STRING + "\n" + CALL, '<tool_call>\n{"name": "f", "arguments": "{\\"s\\": \\"</tool_call>\\"}"}\n</tool_call>',
]), st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_any_chunking_gives_the_whole_turns_result(text, cuts):
    whole_content, whole_calls = parse_tool_calls(text)
    content, calls = _stream(text, cuts)
    assert content == whole_content
    assert [(name, arguments) for _, name, arguments in calls] == [(c.name, c.arguments) for c in whole_calls]
    for _, _, arguments in calls:
        json.loads(arguments)  # complete calls stream complete JSON


def test_a_call_cut_by_max_tokens_streams_its_start_but_is_not_a_call():
    parser = ToolCallStreamParser()
    content, deltas = parser.push('Checking.\n<tool_call>\n{"name": "f", "arguments": {"q": "par')
    tail, more = parser.finish()
    assert content + tail == "Checking." and deltas[0].name == "f"
    assert "".join(d.arguments for d in deltas + more) == '{"q": "par'  # what a streaming client saw
    assert parser.calls == [] and parser.num_unfinished_calls == 1

"""GeneratedTurns finds a turn again by what the client sends back."""

from assembly.generated_turns import GeneratedTurns
from assembly.tool_calls import ToolCall


def _sent_back(content, calls):
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    return message


def test_text_and_tool_turns_are_found_again():
    turns = GeneratedTurns()
    turns.remember("Hello!", [], [5, 6])
    call = ToolCall("call_1", "f", '{"b": 1, "a": [1, 2]}')
    turns.remember(None, [call], [7, 8, 9])
    assert turns.lookup(_sent_back("Hello!", [])) == [5, 6]
    assert turns.lookup(_sent_back("", [call])) == [7, 8, 9]  # content None and "" alike
    reserialised = ToolCall("call_1", "f", '{"a":[1,2],"b":1}')
    assert turns.lookup(_sent_back(None, [reserialised])) == [7, 8, 9]
    assert turns.lookup(_sent_back(None, [ToolCall("call_2", "f", call.arguments)])) is None
    assert turns.lookup(_sent_back("Hello?", [])) is None
    assert turns.lookup({"role": "assistant", "content": None, "tool_calls": ["not a call"]}) is None


def test_bounded_by_tokens_least_recently_used_first_out():
    turns = GeneratedTurns(max_tokens=4)
    turns.remember("a", [], [1, 1])
    turns.remember("b", [], [2])
    assert turns.lookup(_sent_back("a", [])) == [1, 1]  # a is now the most recent
    turns.remember("c", [], [3, 3])
    assert len(turns) == 2 and turns.num_tokens == 4
    assert turns.lookup(_sent_back("b", [])) is None and turns.lookup(_sent_back("a", [])) == [1, 1]


def test_a_turn_is_found_only_in_the_scope_it_was_remembered_in():
    turns = GeneratedTurns()
    turns.remember("Hello!", [], [5, 6], scope="a")
    assert turns.lookup(_sent_back("Hello!", []), "a") == [5, 6]
    assert turns.lookup(_sent_back("Hello!", []), "b") is None and turns.lookup(_sent_back("Hello!", [])) is None

"""The prompt builder: built-in tool and document blocks, native tool templates, splicing of generated turns."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assembly.chat_template import ChatTemplate, TemplateError
from assembly.generated_turns import GeneratedTurns
from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import SegmentTokenizer
from assembly.tool_call_stream import parse_tool_calls

pytestmark = pytest.mark.model  # the real SmolLM2 tokenizer and template


@pytest.fixture
def smollm2_builder(smollm2_dir, smollm2_tokenizer) -> PromptBuilder:
    return PromptBuilder(SegmentTokenizer(smollm2_tokenizer), ChatTemplate.from_model_dir(smollm2_dir),
                         GeneratedTurns())


def test_builtin_blocks_for_a_template_without_tools(smollm2_builder, tools, conversation):
    documents = [{"id": "d1", "title": "Paris", "text": "Paris is the capital of France."}]
    text = smollm2_builder.render(conversation, tools=tools, documents=documents)
    system_turn = text.split("<|im_end|>")[0]
    # Stable parts first, in order: system prompt, tools, documents.
    assert system_turn.startswith("<|im_start|>system\nYou are a weather bot.\n\n# Tools")
    assert system_turn.index("# Tools") < system_turn.index("# Documents")
    assert json.dumps(tools[0]) in system_turn and '<document id="d1" title="Paris">' in system_turn
    # The assistant's call in the Hermes format the model is asked to write; its result as a user turn.
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "unit": "celsius"}}\n</tool_call><|im_end|>') in text
    assert ('<|im_start|>user\n<tool_response>\n{"temperature": 21, "sky": "clear"}\n</tool_response>'
            '<|im_end|>') in text
    assert text.endswith("<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n")


def test_consecutive_tool_results_share_one_user_turn(smollm2_builder):
    messages = [{"role": "user", "content": "Both?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "g", "arguments": '{"x": 1}'}}]},
                {"role": "tool", "tool_call_id": "a", "content": "one"},
                {"role": "tool", "tool_call_id": "b", "content": "two"}]
    text = smollm2_builder.render(messages)
    assert ("<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n"
            "</tool_response><|im_end|>") in text
    # What the built-in block writes parses back to the same calls.
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    content, calls = parse_tool_calls(turn)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {}), ("g", {"x": 1})]


def test_no_system_message_gets_one_for_the_blocks(smollm2_builder, tools):
    text = smollm2_builder.render([{"role": "user", "content": "Hi"}], tools=tools)
    assert text.startswith("<|im_start|>system\n# Tools")


def test_native_tool_templates_get_tools_and_parsed_arguments(smollm2_tokenizer, tool_template_sources, tools,
                                                              conversation):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(smollm2_tokenizer.path.parent))
    for source in tool_template_sources.values():
        builder = PromptBuilder(SegmentTokenizer(smollm2_tokenizer), ChatTemplate(source, {"bos_token": hf.bos_token}))
        parsed = json.loads(json.dumps(conversation))
        parsed[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris", "unit": "celsius"}
        parsed[2]["content"] = None
        expected = hf.apply_chat_template(parsed, tools=tools, chat_template=source, tokenize=False,
                                          add_generation_prompt=True)
        assert builder.render(conversation, tools=tools) == expected


def test_bad_tool_call_arguments_are_template_errors(smollm2_builder):
    messages = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]
    with pytest.raises(TemplateError, match=r"messages\[0\].tool_calls\[0\].function.arguments"):
        smollm2_builder.build(messages)


def _turn_ids(tokenizer, text: str) -> list[int]:
    """A 'generated' turn that is NOT the canonical tokenization of its text: one id per character."""
    return [token_id for char in text for token_id in tokenizer.encode(char)]


def test_generated_turn_is_spliced_verbatim(smollm2_builder, smollm2_tokenizer):
    history = [{"role": "user", "content": "Say hi."}]
    prompt_ids = smollm2_builder.build(history)
    answer = "Hi there"
    generated = _turn_ids(smollm2_tokenizer, answer)
    assert generated != smollm2_tokenizer.encode(answer)
    smollm2_builder.turns.remember(answer, [], generated)
    next_ids = smollm2_builder.build(history + [{"role": "assistant", "content": answer},
                                                {"role": "user", "content": "Again."}])
    # The next prompt starts with exactly prompt + generated ids: the whole previous turn is a cache hit.
    assert next_ids[:len(prompt_ids) + len(generated)] == prompt_ids + generated
    assert smollm2_tokenizer.decode(next_ids, skip_special_tokens=False) == smollm2_builder.render(
        history + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Again."}])


def test_tool_call_turn_is_found_by_its_call_ids_and_parsed_arguments(smollm2_builder, smollm2_tokenizer, tools):
    history = [{"role": "user", "content": "Weather?"}]
    prompt_ids = smollm2_builder.build(history, tools=tools)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Oslo"}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    generated = smollm2_tokenizer.encode(text)
    smollm2_builder.turns.remember(content, calls, generated)
    sent_back = {"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0].id, "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}  # re-serialised by the client
    next_ids = smollm2_builder.build(history + [sent_back, {"role": "tool", "tool_call_id": calls[0].id,
                                                            "content": "cold"}], tools=tools)
    assert next_ids[:len(prompt_ids) + len(generated)] == prompt_ids + generated
    # Another call id is another turn: rendered, not spliced (but still a valid prompt).
    other = {**sent_back, "tool_calls": [{**sent_back["tool_calls"][0], "id": "call_other"}]}
    assert smollm2_builder.turns.lookup(other) is None


def test_a_forged_sentinel_falls_back_to_plain_rendering(smollm2_builder, smollm2_tokenizer):
    smollm2_builder.turns.remember("ok", [], smollm2_tokenizer.encode("ok"))
    messages = [{"role": "user", "content": "\ue0000\ue001"}, {"role": "assistant", "content": "ok"}]
    ids = smollm2_builder.build(messages, add_generation_prompt=False)
    assert ids == smollm2_tokenizer.encode(smollm2_builder.render(messages, add_generation_prompt=False))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.sampled_from(list("ab c\n\t.é😀") + ["<|im_start|>", "<|im_end|>", "  ", "12"]),
                         max_size=30).map("".join), min_size=1, max_size=6))
def test_segment_tokenization_equals_whole_text(smollm2_tokenizer, texts):
    segments = SegmentTokenizer(smollm2_tokenizer)
    assert segments.is_segmented
    for text in texts:
        assert segments.encode(text) == smollm2_tokenizer.encode(text)
    whole = "".join(texts)
    assert segments.encode(whole) == smollm2_tokenizer.encode(whole)


def test_segment_cache_tokenizes_a_stable_system_turn_once(smollm2_builder, tools):
    segments = smollm2_builder.tokenizer
    system = {"role": "system", "content": "You are a careful agent. " * 20}
    smollm2_builder.build([system, {"role": "user", "content": "first"}], tools=tools)
    misses = segments.num_misses
    smollm2_builder.build([system, {"role": "user", "content": "second question"}], tools=tools)
    # Only the new user turn (and the generation prompt is cached too) was tokenized again.
    assert segments.num_misses - misses == 1

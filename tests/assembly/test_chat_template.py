"""Chat templates render as transformers' `apply_chat_template` does, inside a sandbox."""

import copy
import json

import pytest

from assembly.chat_template import ChatTemplate, TemplateError

pytestmark = pytest.mark.model  # the real SmolLM2 tokenizer and template


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def _special_tokens(hf_tokenizer) -> dict[str, str]:
    return {name: getattr(hf_tokenizer, name) for name in ("bos_token", "eos_token", "pad_token", "unk_token")
            if getattr(hf_tokenizer, name) is not None}


def _with_parsed_arguments(messages: list[dict]) -> list[dict]:
    """What templates get: tool-call arguments as objects (the prompt builder parses them)."""
    messages = copy.deepcopy(messages)
    for message in messages:
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        if message["content"] is None:
            message["content"] = ""
    return messages


def test_smollm2_template_matches_transformers(smollm2_dir, hf_tokenizer):
    ours = ChatTemplate.from_model_dir(smollm2_dir)
    assert not ours.supports_tools and not ours.supports_documents
    conversations = [
        [{"role": "user", "content": "Hi <b>there</b> & 'you'"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
    ]
    for messages in conversations:
        for add_generation_prompt in (True, False):
            expected = hf_tokenizer.apply_chat_template(messages, tokenize=False,
                                                        add_generation_prompt=add_generation_prompt)
            assert ours.render(messages, add_generation_prompt=add_generation_prompt) == expected


@pytest.mark.parametrize("style", ["qwen-style", "llama3-style"])
def test_tool_templates_match_transformers(style, tool_template_sources, tools, conversation, hf_tokenizer):
    source = tool_template_sources[style]
    ours = ChatTemplate(source, _special_tokens(hf_tokenizer))
    assert ours.supports_tools
    messages = _with_parsed_arguments(conversation)
    for tools in (tools, None):
        expected = hf_tokenizer.apply_chat_template(messages, tools=tools, chat_template=source, tokenize=False,
                                                    add_generation_prompt=True)
        rendered = ours.render(messages, tools=tools, add_generation_prompt=True)
        assert rendered == expected
        assert tools is None or "<with markup> & more" in rendered  # tojson does not HTML-escape


def test_tojson_keeps_markup_and_unicode():
    template = ChatTemplate("{{ value | tojson }}|{{ value | tojson(indent=2) }}")
    rendered = template.render([], template_kwargs={"value": {"a": "<b> & 'c' °"}})
    assert rendered.startswith('{"a": "<b> & \'c\' °"}|{\n  "a"')


def test_raise_exception_and_strftime_now():
    with pytest.raises(TemplateError, match="only user turns"):
        ChatTemplate("{{ raise_exception('only user turns') }}").render([])
    assert ChatTemplate("{{ strftime_now('%Y') }}").render([]).isdigit()


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{{ raise_exception.__globals__['__builtins__'] }}",
    "{% set x = messages.append(1) %}",  # immutable sandbox: no mutating calls
])
def test_sandbox_refuses_python_internals(source):
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_syntax_errors_and_broken_messages_are_template_errors():
    with pytest.raises(TemplateError, match="syntax error"):
        ChatTemplate("{% for %}")
    with pytest.raises(TemplateError):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render([{"role": "user", "content": "x"}])


def test_template_kwargs_reach_the_template_but_not_reserved_names():
    template = ChatTemplate("{{ greeting }} {{ messages | length }}")
    assert template.render([{"role": "user", "content": "x"}], template_kwargs={"greeting": "hello"}) == "hello 1"
    with pytest.raises(TemplateError, match="may not set"):
        template.render([], template_kwargs={"messages": []})


def test_chat_template_file_overrides_the_models(tmp_path, smollm2_dir):
    path = tmp_path / "mine.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    template = ChatTemplate.from_model_dir(smollm2_dir, path)
    assert template.render([{"role": "user", "content": "hi"}]) == "[user]hi"
    with pytest.raises(TemplateError, match="no such"):
        ChatTemplate.from_model_dir(smollm2_dir, tmp_path / "missing.jinja")

"""Fixtures of the assembly tests: two tool-capable chat templates written for the tests, in the
shapes of Qwen2.5's and Llama 3.1's (they render `tools` themselves, so the prompt builder passes
tools and tool calls through to them), tools, and an OpenAI-shaped conversation using them."""

import copy

import pytest

QWEN_STYLE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
        {%- continue %}
    {%- endif %}
    {%- if message.role == 'user' or message.role == 'system' or (message.role == 'assistant' and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

LLAMA3_STYLE = r"""
{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools is not none %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, respond with a JSON for a function call.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\n\n' }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- "<|eot_id|>" }}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls | length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", "parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {{- message.content }}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_docs", "description": "Search the documentation <with markup> & more.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
]

# OpenAI-shaped conversation: a tool call (arguments as a JSON string), its result, a final answer.
CONVERSATION = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris? Answer in °C."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'},
    {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.fixture
def tool_template_sources() -> dict[str, str]:
    return {"qwen-style": QWEN_STYLE, "llama3-style": LLAMA3_STYLE}


@pytest.fixture
def tools() -> list[dict]:
    return copy.deepcopy(TOOLS)


@pytest.fixture
def conversation() -> list[dict]:
    return copy.deepcopy(CONVERSATION)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from assembly.tokenizer import Tokenizer

    return Tokenizer(smollm2_dir)

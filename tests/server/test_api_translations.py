"""Anthropic and Responses requests as the internal job: messages, tool turns, breakpoints (no model)."""

import json

from server.api_anthropic.schemas import MessagesRequest
from server.api_anthropic.translation import TranslatedPrompt, messages_job
from server.api_responses.schemas import ResponsesRequest
from server.api_responses.translation import responses_job, responses_prompt
from server.job import CacheBreakpoint

EPHEMERAL_1H = {"type": "ephemeral", "ttl": "1h"}


def test_anthropic_blocks_become_chat_turns_and_breakpoints():
    request = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 8, "cache_control": {"type": "ephemeral"},
        "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B", "cache_control": EPHEMERAL_1H}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q1", "cache_control": {"type": "ephemeral"}},
                                         {"type": "text", "text": "q2"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r1"},
                                         {"type": "text", "text": "more"}]},
        ]})
    prompt = TranslatedPrompt(request)
    assert prompt.messages == [
        {"role": "system", "content": "A\n\nB"},
        {"role": "user", "content": "q1q2"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"x": 1})}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "r1"},
        {"role": "user", "content": "more"},
    ]
    assert prompt.sources == ["system", "messages[0]", "messages[1]", "messages[2]", "messages[2]"]
    assert prompt.breakpoints == [CacheBreakpoint(0, 3600.0, "A\n\nB"), CacheBreakpoint(-1, 300.0),
                                  CacheBreakpoint(1, 300.0, "q1"), CacheBreakpoint(4, 300.0)]
    job = messages_job(request, prompt)
    assert job.tool_choice == "required" and not job.parallel_tool_calls and job.max_new_tokens == 8


def test_responses_items_become_chat_turns():
    request = ResponsesRequest.model_validate({
        "instructions": "Be brief.", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi",
                                          "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"}}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
        ]})
    prompt = responses_prompt(request, None)
    assert prompt.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Let me look.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    assert prompt.sources == ["instructions", "input[0]", "input[1]", "input[3]"]
    assert prompt.breakpoints == [CacheBreakpoint(1, 43200.0)]
    assert responses_job(request, prompt).tool_choice == "function:f"

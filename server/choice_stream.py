"""A prepared job's choices on the engine: token ids -> text, stop strings, tool calls, n > 1.

`ChoiceRunner.generate` drives AsyncEngine and yields ChoiceDelta; `complete`
collects them into ChoiceResult. What every API shares once the prompt is
built: detokenization (UTF-8 safe, incremental), stop strings matched across
token boundaries, tool calls split from content as text streams in
(assembly's ToolCallStreamParser), the grammar's logits processor, and usage
as the engine reports it. An engine output of several tokens (speculative decoding) is taken one
token at a time, so all of that behaves as with one token a step.

n > 1 choices share the prompt's KV pages: choice 0 runs alone until its first
token, by which time its prompt's full pages are in the radix tree; only then
are choices 1..n-1 submitted, and their admission matches those pages.

Cancellation: every engine stream is closed on every way out (finish, stop
string, error, the consumer closing this generator or its task being
cancelled), and AsyncEngine aborts a stream closed before its end, so a
client that goes away frees its pages within one engine step.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from functools import partial

from assembly.constrained_output import GrammarCompiler
from assembly.detokenizer import IncrementalDetokenizer
from assembly.stop_strings import StopStringMatcher
from assembly.tool_call_stream import ToolCallDelta, ToolCallStreamParser
from assembly.tool_calls import ToolCall, message_content
from engine.engine_handle import EngineHandle
from engine.request import FinishReason, RequestOutput
from server.interleave import interleave
from server.job import GenerationJob
from server.sampling import choice_params


@dataclass(frozen=True)
class ChoiceDelta:
    """What one engine output added to one choice."""

    index: int
    text: str  # complete characters, stop strings and tool calls removed; may be ""
    token_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[int, float]]] | None
    finish_reason: str | None  # "stop" | "length" | "tool_calls" on the choice's last delta
    tool_calls: tuple[ToolCallDelta, ...] = ()
    stop_string: str | None = None  # the stop string that ended the choice, on its last delta
    # the engine's prompt logprobs (params.prompt_logprobs), on the choice's first delta only
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None
    # On the last delta of a turn read for tool calls: its complete calls. A call cut off (max_tokens)
    # was streamed as deltas but is no call: a non-streamed answer leaves it out.
    final_calls: tuple[ToolCall, ...] | None = None


@dataclass
class Usage:
    """Filled in as outputs arrive; read by the response and the access log."""

    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # of the prompt, not computed: prefix cache + document store (choice 0's admission)
    num_reused_document_tokens: int = 0  # of those, placed from the document store (derived KV)
    num_disk_tier_tokens: int = 0  # of num_cached_tokens, loaded from the disk tier
    num_recomputed_document_tokens: int = 0  # of the computed ones, tokens of reused document spans (boundaries)
    num_completion_tokens_by_choice: dict[int, int] = field(default_factory=dict)
    # speculation, per choice: (draft tokens verified, accepted)
    draft_tokens_by_choice: dict[int, tuple[int, int]] = field(default_factory=dict)
    first_token_time: float | None = None  # time.perf_counter() of the first output
    last_token_time: float | None = None  # of the latest
    finish_reason: str | None = None  # choice 0's engine finish reason, once it finished

    @property
    def num_completion_tokens(self) -> int:
        return sum(self.num_completion_tokens_by_choice.values())

    def record(self, index: int, output: RequestOutput) -> None:
        if index == 0:
            self.num_prompt_tokens = output.num_prompt_tokens
            self.num_cached_tokens = output.num_cached_tokens
            self.num_reused_document_tokens = output.num_reused_document_tokens
            self.num_disk_tier_tokens = output.num_disk_tier_tokens
            self.num_recomputed_document_tokens = output.num_recomputed_document_tokens
            if output.finish_reason is not None:
                self.finish_reason = output.finish_reason.value
        self.num_completion_tokens_by_choice[index] = output.num_output_tokens
        self.draft_tokens_by_choice[index] = (output.num_draft_tokens, output.num_accepted_draft_tokens)
        self.last_token_time = time.perf_counter()
        if self.first_token_time is None:
            self.first_token_time = self.last_token_time


@dataclass
class ChoiceResult:
    """A whole choice, for non-streamed responses."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop_string: str | None = None

    def add(self, delta: ChoiceDelta) -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
            self.top_logprobs = (self.top_logprobs or []) + (delta.top_logprobs or [[] for _ in delta.logprobs])
        self.finish_reason = delta.finish_reason or self.finish_reason
        self.stop_string = delta.stop_string or self.stop_string
        for call in delta.tool_calls:  # reassembled as a streaming client would
            if call.id is not None:
                self.tool_calls.append(ToolCall(call.id, call.name, call.arguments))
            else:
                last = self.tool_calls[call.index]
                self.tool_calls[call.index] = replace(last, arguments=last.arguments + call.arguments)
        if delta.final_calls is not None:
            self.tool_calls = list(delta.final_calls)

    @property
    def content(self) -> str | None:
        return message_content(self.text, self.tool_calls)


@dataclass(frozen=True)
class FinishedChoice:
    """A choice that ended without a stop string, as the turn memory and pins need it."""

    index: int
    reason: FinishReason
    generated_ids: list[int]  # all of them, the stop token included
    content: str
    calls: list[ToolCall]  # complete calls only
    has_unfinished_call: bool = False  # a call whose arguments never ended (cut by max_tokens)


OnFinish = Callable[[GenerationJob, FinishedChoice], None]


class ChoiceRunner:
    def __init__(self, engine: EngineHandle, tokenizer, grammars: GrammarCompiler, on_finish: OnFinish):
        self.engine = engine
        self.tokenizer = tokenizer  # for decoding
        self.grammars = grammars
        self.on_finish = on_finish  # called once per choice that ends without a stop string

    async def generate(self, job: GenerationJob, usage: Usage) -> AsyncIterator[ChoiceDelta]:
        """Deltas of all choices, interleaved as they come; choices 1.. start once choice 0 has its
        first output, so they find its prompt pages in the tree. Raises RequestError if the engine
        refuses the request (before any delta)."""
        first_output = asyncio.Event()

        async def first_choice() -> AsyncIterator[ChoiceDelta]:
            try:
                async with aclosing(self._run_choice(job, 0, usage)) as deltas:
                    async for delta in deltas:
                        first_output.set()
                        yield delta
            finally:
                first_output.set()  # choice 0 failed or ended: never leave the others waiting

        async def later_choice(index: int) -> AsyncIterator[ChoiceDelta]:
            await first_output.wait()
            async with aclosing(self._run_choice(job, index, usage)) as deltas:
                async for delta in deltas:
                    yield delta

        streams = [first_choice, *(partial(later_choice, i) for i in range(1, job.num_choices))]
        async with aclosing(interleave(streams, job.request_id)) as deltas:
            async for delta in deltas:
                yield delta

    async def complete(self, job: GenerationJob, usage: Usage) -> list[ChoiceResult]:
        results = [ChoiceResult(i) for i in range(job.num_choices)]
        async with aclosing(self.generate(job, usage)) as deltas:
            async for delta in deltas:
                results[delta.index].add(delta)
        return results

    async def _run_choice(self, job: GenerationJob, index: int, usage: Usage) -> AsyncIterator[ChoiceDelta]:
        detokenizer = IncrementalDetokenizer(self.tokenizer)
        stops = StopStringMatcher(job.stop_strings)
        tool_calls = ToolCallStreamParser(job.tool_call_id_prefix) if job.parses_tool_calls else None
        params = choice_params(job.params, index)
        if job.grammar is not None:  # compiling it takes up to seconds: off the event loop
            processor = await asyncio.to_thread(self.grammars.processor, job.grammar)
            params = replace(params, logits_processors=(processor,))
        engine_request_id = f"{job.request_id}-{index}"
        generated_ids: list[int] = []
        content: list[str] = []
        raw_text, num_emitted_chars = "", 0  # before / after stop strings, to name the one that matched
        outputs = self.engine.generate(engine_request_id, job.prompt_token_ids, params, job.cache_salt,
                                       affinity_key=job.affinity_key, options=job.engine_options)
        async with aclosing(outputs):
            async for engine_output in outputs:
                # one token at a time, as without speculation: a stop string, the usage and the logprobs
                # then end at the token that completes the stop string, not at the end of the output
                for output in _one_token_outputs(engine_output):
                    usage.record(index, output)
                    generated_ids.extend(output.new_token_ids)
                    text = detokenizer.push(output.new_token_ids)
                    is_last = output.finish_reason is not None
                    if is_last:
                        text += detokenizer.flush()
                    raw_text += text
                    text, is_stopped = stops.push(text)
                    if is_last and not is_stopped:
                        text += stops.flush()
                    num_emitted_chars += len(text)
                    stop_string = _matched_stop(job.stop_strings, raw_text[num_emitted_chars:]) if is_stopped else None
                    finish_reason = "stop" if is_stopped else (output.finish_reason.value if is_last else None)
                    call_deltas: tuple[ToolCallDelta, ...] = ()
                    final_calls = None
                    if tool_calls is not None:
                        text, new_calls = tool_calls.push(text)
                        if finish_reason is not None:
                            tail, more_calls = tool_calls.finish()
                            text, new_calls = text + tail, new_calls + more_calls
                            if tool_calls.calls and finish_reason == "stop":
                                finish_reason = "tool_calls"
                            final_calls = tuple(tool_calls.calls)
                        call_deltas = tuple(new_calls)
                    content.append(text)
                    yield ChoiceDelta(index, text, list(output.new_token_ids), output.logprobs,
                                      output.top_logprobs, finish_reason, call_deltas, stop_string,
                                      output.prompt_logprobs, output.prompt_top_logprobs, final_calls)
                    if finish_reason is not None:
                        if not is_stopped:
                            calls = tool_calls.calls if tool_calls is not None else []
                            unfinished = tool_calls is not None and tool_calls.num_unfinished_calls > 0
                            self.on_finish(job, FinishedChoice(index, output.finish_reason, generated_ids,
                                                               "".join(content), list(calls), unfinished))
                        return  # a stop string ends the choice here; closing the stream aborts it


def _one_token_outputs(output: RequestOutput) -> list[RequestOutput]:
    """An engine output of several tokens (speculative decoding verified a draft) as the outputs of one
    token each that decoding without speculation would have given: logprobs split per token, the prompt
    logprobs on the first, the finish reason on the last."""
    num_tokens = len(output.new_token_ids)
    if num_tokens <= 1:
        return [output]
    first_count = output.num_output_tokens - num_tokens
    return [replace(output, new_token_ids=[token_id],
                    logprobs=None if output.logprobs is None else output.logprobs[i:i + 1],
                    top_logprobs=None if output.top_logprobs is None else output.top_logprobs[i:i + 1],
                    finish_reason=output.finish_reason if i == num_tokens - 1 else None,
                    num_output_tokens=first_count + i + 1,
                    prompt_logprobs=output.prompt_logprobs if i == 0 else None,
                    prompt_top_logprobs=output.prompt_top_logprobs if i == 0 else None)
            for i, token_id in enumerate(output.new_token_ids)]


def _matched_stop(stop_strings: tuple[str, ...], tail: str) -> str | None:
    """The stop string the held-back tail starts with (the matcher cut the text right before it)."""
    return next((s for s in stop_strings if tail.startswith(s)), None)

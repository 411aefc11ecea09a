"""Runs a validated completion request on the engine and yields text deltas per choice.

What the handlers call: `prepare_chat` / `prepare_completion` turn a request
into a GenerationJob (prompt ids, SamplingParams, stop strings); they render,
tokenize and compile grammars, up to seconds of CPU for a large request, so
the handlers run them in a worker thread, never on the event loop. `generate`
drives AsyncEngine and yields ChoiceDelta, `complete` collects them.

Chat turns: with tools (and tool_choice not none) the text is read for tool
calls as it streams (assembly's ToolCallStreamParser); a forced call, the calls
of tool_choice auto (free text, but a call once begun must be valid) and a JSON
response_format run under a grammar (a logits processor per choice). Every
finished chat turn's generated ids are remembered (GeneratedTurns), so when the
client sends the turn back it is spliced into the next prompt verbatim; a turn
that ends in tool calls has its prefix pinned in the cache for
`tool_pin_seconds`, for the tool's result to find.

n > 1 choices share the prompt's KV pages: choice 0 runs alone until its first
token, by which time its prompt's full pages are in the radix tree; only then
are choices 1..n-1 submitted, and their admission matches those pages.

Cancellation: every engine stream is closed on every way out (finish, stop
string, error, the consumer closing this generator or its task being
cancelled), and AsyncEngine aborts a stream closed before its end, so a
client that goes away frees its pages within one engine step.
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace

from assembly.constrained_output import (GrammarCompiler, GrammarError, json_grammar, optional_tool_calls_grammar,
                                         tool_call_grammar)
from assembly.detokenizer import IncrementalDetokenizer
from assembly.generated_turns import GeneratedTurns
from assembly.schema_finiteness import unsatisfiable_field
from assembly.stop_strings import StopStringMatcher
from assembly.tool_call_stream import ToolCallDelta, ToolCallStreamParser
from assembly.tool_calls import ToolCall, message_content
from engine.async_engine import AsyncEngine
from engine.request import FinishReason, RequestOutput
from engine.sampling_params import SamplingParams
from server.errors import APIError, invalid_request
from server.prompts import RequestPrompts
from server.sampling import choice_params, sampling_params
from server.schemas import ChatCompletionRequest, CompletionRequest, NamedToolChoice
from server.settings import ServerSettings

RETRY_AFTER_SECONDS = 1


@dataclass(frozen=True)
class GenerationJob:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stop_strings: tuple[str, ...] = ()
    num_choices: int = 1
    cache_salt: str | None = None
    grammar: str | None = None  # llguidance grammar the output must follow
    parses_tool_calls: bool = False
    is_chat: bool = False  # chat turns are remembered for splicing into the next prompt


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
    # On the last delta of a turn read for tool calls: its complete calls. A call cut off (max_tokens)
    # was streamed as deltas but is no call: a non-streamed answer leaves it out.
    final_calls: tuple[ToolCall, ...] | None = None


@dataclass
class Usage:
    """Filled in as outputs arrive; read by the response and the access log."""

    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # of the prompt, served from the prefix cache (choice 0's admission)
    num_completion_tokens_by_choice: dict[int, int] = field(default_factory=dict)
    first_token_time: float | None = None  # time.perf_counter() of the first output

    @property
    def num_completion_tokens(self) -> int:
        return sum(self.num_completion_tokens_by_choice.values())

    def record(self, index: int, output: RequestOutput) -> None:
        if index == 0:
            self.num_prompt_tokens = output.num_prompt_tokens
            self.num_cached_tokens = output.num_cached_tokens
        self.num_completion_tokens_by_choice[index] = output.num_output_tokens
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()


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

    def add(self, delta: ChoiceDelta) -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
            self.top_logprobs = (self.top_logprobs or []) + (delta.top_logprobs or [[] for _ in delta.logprobs])
        self.finish_reason = delta.finish_reason or self.finish_reason
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


class CompletionService:
    def __init__(self, engine: AsyncEngine, prompts: RequestPrompts, grammars: GrammarCompiler,
                 settings: ServerSettings, turns: GeneratedTurns | None = None):
        self.engine = engine
        self.prompts = prompts
        self.grammars = grammars
        self.settings = settings
        self.turns = turns
        llm = engine.engine
        # The longest prompt + output one request can have: the context, and the whole KV pool.
        num_pool_tokens = engine.stats().num_pages * llm.config.page_size
        self.max_num_request_tokens = min(llm.max_model_len, num_pool_tokens)
        # The longest prompt it could take (room for one output token); a max_tokens that does not fit
        # beside the prompt is the engine's to report, with both numbers.
        self.max_num_prompt_tokens = self.max_num_request_tokens - 1

    # ---- requests -> jobs ---------------------------------------------------

    def prepare_chat(self, request: ChatCompletionRequest, request_id: str,
                     retrieved_documents: Sequence[dict] = ()) -> GenerationJob:
        """`retrieved_documents` go into the prompt after the request's own documents."""
        self._check_model(request.model)
        self._check_capacity()
        prompt_ids = self.prompts.chat_prompt_ids(request, retrieved_documents, self.max_num_prompt_tokens)
        # No max_tokens: as OpenAI, up to the end of the context.
        max_new_tokens = request.max_new_tokens or max(1, self.max_num_request_tokens - len(prompt_ids))
        job = self._job(request, request_id, prompt_ids, max_new_tokens)
        return replace(job, grammar=self._chat_grammar(request), parses_tool_calls=request.parses_tool_calls,
                       is_chat=True)

    def _chat_grammar(self, request: ChatCompletionRequest) -> str | None:
        """The grammar the output runs under: a forced tool call, the calls tool_choice auto lets the
        model make (text stays free), or a JSON response_format; None when free."""
        choice = request.tool_choice
        tools = [{"name": t.function.name, "parameters": t.function.parameters} for t in request.tools or ()
                 if not isinstance(choice, NamedToolChoice) or t.function.name == choice.function.name]
        self._check_schema_size(request, tools)
        self._check_schemas_are_finite(request)
        if request.forces_tool_call:
            lark, param = tool_call_grammar(tools, parallel=request.parallel_tool_calls and choice == "required"), "tools"
        elif request.response_format is not None and request.response_format.type != "text":
            spec = request.response_format.json_schema
            lark, param = json_grammar(spec.schema_ if spec is not None else None), "response_format"
        elif request.parses_tool_calls:
            lark, param = optional_tool_calls_grammar(tools), "tools"
        else:
            return None
        try:
            return self.grammars.check(lark)
        except GrammarError as error:
            raise invalid_request(f"{param}: the schema cannot be used to constrain output: {error}",
                                  param=param) from None

    def _check_schema_size(self, request: ChatCompletionRequest, tools: list[dict]) -> None:
        """Refuse schemas too large to compile into a grammar quickly, before compiling them."""
        spec = request.response_format.json_schema if request.response_format is not None else None
        schemas = [tool["parameters"] for tool in tools if tool["parameters"]] if request.parses_tool_calls else []
        if spec is not None and spec.schema_ is not None:
            schemas.append(spec.schema_)
        num_bytes = len(json.dumps(schemas, ensure_ascii=False).encode()) if schemas else 0
        if num_bytes > self.settings.max_schema_bytes:
            param = "tools" if request.parses_tool_calls else "response_format"
            raise invalid_request(f"{param}: the schemas are {num_bytes} bytes of JSON, more than the "
                                  f"{self.settings.max_schema_bytes} this server compiles into a grammar "
                                  f"(--max-schema-bytes)", param=param)

    @staticmethod
    def _check_schemas_are_finite(request: ChatCompletionRequest) -> None:
        """A schema no finite value fits (required fields that recurse for ever) is a 400 naming the field:
        under its grammar the model could only write until max_tokens cut it."""
        schemas = []
        if request.parses_tool_calls:
            schemas += [(f"tools[{i}].function.parameters", "tools", tool.function.parameters)
                        for i, tool in enumerate(request.tools) if tool.function.parameters]
        spec = request.response_format.json_schema if request.response_format is not None else None
        if spec is not None and spec.schema_ is not None:
            schemas.append(("response_format.json_schema.schema", "response_format", spec.schema_))
        for where, param, schema in schemas:
            field = unsatisfiable_field(schema)
            if field is not None:
                what = f"the required field {field!r} can only hold an infinitely nested value" if field \
                    else "nothing can satisfy it"
                raise invalid_request(f"{where}: no finite JSON value fits this schema: {what}", param=param)

    def prepare_completion(self, request: CompletionRequest, request_id: str) -> GenerationJob:
        self._check_model(request.model)
        self._check_capacity()
        prompt_ids = self.prompts.completion_prompt_ids(request, self.max_num_prompt_tokens)
        return self._job(request, request_id, prompt_ids, request.max_new_tokens)

    def _job(self, request, request_id: str, prompt_ids: list[int], max_new_tokens: int) -> GenerationJob:
        return GenerationJob(request_id=request_id, prompt_token_ids=prompt_ids,
                             params=sampling_params(request, max_new_tokens),
                             stop_strings=tuple(request.stop or ()), num_choices=request.n,
                             cache_salt=request.cache_salt)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.settings.served_model_name:
            raise APIError(404, f"model {model!r} does not exist; this server serves "
                                f"{self.settings.served_model_name!r}", param="model", code="model_not_found")

    def _check_capacity(self) -> None:
        num_waiting = self.engine.stats().num_waiting
        if num_waiting >= self.settings.max_waiting:
            raise APIError(503, f"the server is overloaded ({num_waiting} requests waiting); retry shortly",
                           code="overloaded", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    # ---- running ------------------------------------------------------------

    async def generate(self, job: GenerationJob, usage: Usage) -> AsyncIterator[ChoiceDelta]:
        """Deltas of all choices, interleaved as they come. Raises RequestError if the engine
        refuses the request (before any delta)."""
        if job.num_choices == 1:
            async with aclosing(self._run_choice(job, 0, usage)) as deltas:
                async for delta in deltas:
                    yield delta
            return
        async with aclosing(self._run_choices(job, usage)) as deltas:
            async for delta in deltas:
                yield delta

    async def complete(self, job: GenerationJob, usage: Usage) -> list[ChoiceResult]:
        results = [ChoiceResult(i) for i in range(job.num_choices)]
        async with aclosing(self.generate(job, usage)) as deltas:
            async for delta in deltas:
                results[delta.index].add(delta)
        return results

    async def _run_choices(self, job: GenerationJob, usage: Usage) -> AsyncIterator[ChoiceDelta]:
        """n > 1: one task per choice feeding a queue; choices 1.. start after choice 0's first output."""
        deltas: asyncio.Queue = asyncio.Queue()
        first_output = asyncio.Event()
        done = object()

        async def pump(index: int) -> None:
            try:
                if index > 0:
                    await first_output.wait()
                async with aclosing(self._run_choice(job, index, usage)) as choice:
                    async for delta in choice:
                        first_output.set()
                        deltas.put_nowait(delta)
            except Exception as error:  # handed to the consumer, which raises it
                deltas.put_nowait(error)
            finally:
                first_output.set()  # choice 0 failed or ended: never leave the others waiting
                deltas.put_nowait(done)

        tasks = [asyncio.create_task(pump(i), name=f"{job.request_id}-{i}") for i in range(job.num_choices)]
        try:
            num_running = len(tasks)
            while num_running:
                item = await deltas.get()
                if item is done:
                    num_running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            # Cancelling closes each choice's engine stream, which aborts it. Not awaited: this
            # may run inside a cancelled scope (client gone), and the tasks end on their own.
            for task in tasks:
                task.cancel()

    async def _run_choice(self, job: GenerationJob, index: int, usage: Usage) -> AsyncIterator[ChoiceDelta]:
        detokenizer = IncrementalDetokenizer(self.prompts.tokenizer)
        stops = StopStringMatcher(job.stop_strings)
        tool_calls = ToolCallStreamParser() if job.parses_tool_calls else None
        params = choice_params(job.params, index)
        if job.grammar is not None:  # compiling it takes up to seconds: off the event loop
            processor = await asyncio.to_thread(self.grammars.processor, job.grammar)
            params = replace(params, logits_processors=(processor,))
        engine_request_id = f"{job.request_id}-{index}"
        generated_ids: list[int] = []
        content: list[str] = []
        outputs = self.engine.generate(engine_request_id, job.prompt_token_ids, params, job.cache_salt)
        async with aclosing(outputs):
            async for output in outputs:
                if output.error is not None:
                    raise RuntimeError(f"engine failed request {engine_request_id}: {output.error}")
                usage.record(index, output)
                generated_ids.extend(output.new_token_ids)
                text = detokenizer.push(output.new_token_ids)
                is_last = output.finish_reason is not None
                if is_last:
                    text += detokenizer.flush()
                text, is_stopped = stops.push(text)
                if is_last and not is_stopped:
                    text += stops.flush()
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
                                  output.top_logprobs, finish_reason, call_deltas, final_calls)
                if finish_reason is not None:
                    # A turn with a call cut off cannot come back as the same message: not remembered.
                    if job.is_chat and not is_stopped and not (tool_calls and tool_calls.num_unfinished_calls):
                        self._keep_turn(job, output.finish_reason, generated_ids, "".join(content),
                                        tool_calls.calls if tool_calls is not None else [])
                    return  # a stop string ends the choice here; closing the stream aborts it

    def _keep_turn(self, job: GenerationJob, reason: FinishReason, generated_ids: list[int], content: str,
                   calls: list[ToolCall]) -> None:
        """Remember a finished turn's ids for the next prompt; pin a tool-call turn's prefix."""
        if self.turns is not None:
            # A stop token is the end of the turn, which the template writes itself.
            turn_ids = generated_ids[:-1] if reason is FinishReason.STOP else generated_ids
            self.turns.remember(message_content(content, calls), calls, turn_ids)
        if calls and self.settings.tool_pin_seconds > 0:
            self.engine.pin(job.prompt_token_ids + generated_ids, job.cache_salt, self.settings.tool_pin_seconds)

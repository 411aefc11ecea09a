"""Requests -> prepared jobs, and what a finished turn leaves behind (turn memory, pins).

Every chat-like API hands `prepare` a ChatJob (server/job.py): the prompt is
rendered and tokenized by the prompt builder, the grammar chosen (a forced tool
call, the calls tool_choice auto lets the model make, a JSON output format),
the sampling fields checked, and the cache breakpoints turned into prefix
lengths (each API's translation builds the ChatJob: server/chat_translation.py,
server/api_anthropic/, server/api_responses/). `prepare_completion` is legacy
completions' entry. Both render, tokenize and check schemas, up to seconds of
CPU for a large request, so every route runs them in a worker thread, never on
the event loop (cheap bounds first: the prompt's length against the pool,
--max-schema-bytes, schemas no finite value fits). Running the job (detokenize,
stop strings, tool calls, n > 1) is server/choice_stream.py's; `generate` and
`complete` hand it on.

When a chat turn finishes, its generated ids are remembered (GeneratedTurns),
so when the client sends the turn back it is spliced into the next prompt
verbatim (only into a prompt of the same API key, cache salt and
prompt_cache_key: `turn_scope`); a turn that ends in tool calls has its prefix pinned in the cache for
`PinConfig.tool_seconds`, for the tool's result to find; and every cache breakpoint
the request named is pinned for its TTL.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace

from assembly.constrained_output import (GrammarCompiler, GrammarError, json_grammar, optional_tool_calls_grammar,
                                         tool_call_grammar)
from assembly.generated_turns import GeneratedTurns
from assembly.schema_finiteness import unsatisfiable_field
from assembly.tool_calls import message_content
from engine.engine_handle import EngineHandle
from engine.request import FinishReason
from server.auth import Caller
from server.choice_stream import ChoiceDelta, ChoiceResult, ChoiceRunner, FinishedChoice, Usage
from server.errors import APIError, invalid_request
from server.job import ChatJob, GenerationJob, PrefixPin, requested_engine_options
from server.prompts import RequestPrompts
from server.generation_defaults import GenerationDefaults
from server.sampling import sampling_fields, with_defaults
from server.schemas import CompletionRequest
from server.settings import ServerSettings

__all__ = ["ChoiceDelta", "ChoiceResult", "CompletionService", "GenerationJob", "Usage"]

RETRY_AFTER_SECONDS = 1


class CompletionService:
    def __init__(self, engine: EngineHandle, prompts: RequestPrompts, grammars: GrammarCompiler,
                 settings: ServerSettings, defaults: GenerationDefaults, turns: GeneratedTurns | None = None):
        self.engine = engine
        self.defaults = defaults  # every field set: what a request leaves out (server/generation_defaults.py)
        self.prompts = prompts
        self.grammars = grammars
        self.settings = settings
        self.turns = turns
        self.runner = ChoiceRunner(engine, prompts.tokenizer, grammars, self._keep_turn)
        # The longest prompt + output one request can have: the context, and the whole KV pool.
        self.max_num_request_tokens = engine.facts.max_num_request_tokens
        # The longest prompt it could take (room for one output token); a max_tokens that does not fit
        # beside the prompt is the engine's to report, with both numbers.
        self.max_num_prompt_tokens = self.max_num_request_tokens - 1

    # ---- requests -> jobs ---------------------------------------------------

    async def prepare_off_loop(self, job: ChatJob, request_id: str, caller: Caller | None = None) -> GenerationJob:
        """`prepare` in a worker thread: what every chat-like route calls."""
        return await asyncio.to_thread(self.prepare, job, request_id, caller)

    async def prepare_completion_off_loop(self, request: CompletionRequest, request_id: str) -> list[GenerationJob]:
        return await asyncio.to_thread(self.prepare_completion, request, request_id)

    @staticmethod
    def scoped(job: ChatJob, caller: Caller | None) -> ChatJob:
        """`job` with the salt it runs with and the turn memory scope it splices from (idempotent):
        what prepare runs, and what a route renders again for a diagnosis."""
        caller = caller or Caller(key_id="")
        salt = caller.cache_salt(job.cache_salt)
        return replace(job, cache_salt=salt, turn_scope=caller.turn_scope(salt, job.prompt_cache_key))

    def prepare(self, job: ChatJob, request_id: str, caller: Caller | None = None) -> GenerationJob:
        """Raises APIError (unknown model, overloaded), TemplateError; the engine checks the rest."""
        job = self.scoped(job, caller)
        self.check_model(job.model)
        self._check_capacity()
        prompt_ids = self.prompts.job_prompt_ids(job, max_num_tokens=self.max_num_prompt_tokens)
        params = with_defaults(job.sampling, job.max_new_tokens, self.defaults,
                               self.max_num_request_tokens - len(prompt_ids))
        pins = tuple(PrefixPin(num_tokens, min(breakpoint.seconds, self.settings.pins.max_seconds),
                               breakpoint.seconds)
                     for breakpoint, num_tokens in self.prompts.breakpoint_lengths(job, prompt_ids) if num_tokens)
        options = job.engine_options
        if options.document_reuse is not False and self.settings.engine.documents.enabled:
            options = replace(options, document_spans=self.prompts.document_ranges(job, prompt_ids))
        return GenerationJob(request_id=request_id, prompt_token_ids=prompt_ids,
                             params=params,
                             stop_strings=job.stop_strings, num_choices=job.num_choices, cache_salt=job.cache_salt,
                             grammar=self._grammar(job), parses_tool_calls=job.parses_tool_calls,
                             is_chat=job.remembers_turn, pins=pins, turn_scope=job.turn_scope,
                             affinity_key=job.prompt_cache_key, engine_options=options,
                             tool_call_id_prefix=job.tool_call_id_prefix)

    def _grammar(self, job: ChatJob) -> str | None:
        """The grammar the output runs under: a forced tool call, the calls tool_choice auto lets the
        model make (text stays free), or a JSON output format; None when free."""
        named = job.named_tool
        tools = [{"name": t["function"]["name"], "parameters": t["function"].get("parameters")} for t in job.tools
                 if named is None or t["function"]["name"] == named]
        self._check_schema_size(job, tools)
        self._check_schemas_are_finite(job)
        output_param = job.output_format_path.split(".")[0]
        if job.forces_tool_call:
            lark = tool_call_grammar(tools, parallel=job.parallel_tool_calls and job.tool_choice == "required")
            param = "tools"
        elif job.output_format is not None:
            lark, param = json_grammar(job.output_format.schema), output_param
        elif job.parses_tool_calls:
            lark, param = optional_tool_calls_grammar(tools), "tools"
        else:
            return None
        try:
            return self.grammars.check(lark)
        except GrammarError as error:
            raise invalid_request(f"{param}: the schema cannot be used to constrain output: {error}",
                                  param=param) from None

    def _check_schema_size(self, job: ChatJob, tools: list[dict]) -> None:
        """Refuse schemas too large to compile into a grammar quickly, before compiling them."""
        schemas = [tool["parameters"] for tool in tools if tool["parameters"]] if job.parses_tool_calls else []
        if job.output_format is not None and job.output_format.schema is not None:
            schemas.append(job.output_format.schema)
        num_bytes = len(json.dumps(schemas, ensure_ascii=False).encode()) if schemas else 0
        if num_bytes > self.settings.max_schema_bytes:
            param = "tools" if job.parses_tool_calls else job.output_format_path.split(".")[0]
            raise invalid_request(f"{param}: the schemas are {num_bytes} bytes of JSON, more than the "
                                  f"{self.settings.max_schema_bytes} this server compiles into a grammar "
                                  f"(--max-schema-bytes)", param=param)

    @staticmethod
    def _check_schemas_are_finite(job: ChatJob) -> None:
        """A schema no finite value fits (required fields that recurse for ever) is a 400 naming the field:
        under its grammar the model could only write until max_tokens cut it."""
        schemas = []
        if job.parses_tool_calls:
            schemas += [(job.tool_schema_path.format(i), "tools", tool["function"]["parameters"])
                        for i, tool in enumerate(job.tools) if tool["function"].get("parameters")]
        if job.output_format is not None and job.output_format.schema is not None:
            schemas.append((job.output_format_path, job.output_format_path.split(".")[0], job.output_format.schema))
        for where, param, schema in schemas:
            field = unsatisfiable_field(schema)
            if field is not None:
                what = f"the required field {field!r} can only hold an infinitely nested value" if field \
                    else "nothing can satisfy it"
                raise invalid_request(f"{where}: no finite JSON value fits this schema: {what}", param=param)

    def prepare_completion(self, request: CompletionRequest, request_id: str) -> list[GenerationJob]:
        """One job per prompt, each with the request's n choices."""
        self.check_model(request.model)
        self._check_capacity()
        prompt_id_lists = self.prompts.completion_prompt_ids(request, self.max_num_prompt_tokens)
        if len(prompt_id_lists) == 1:
            return [self._completion_job(request, request_id, prompt_id_lists[0])]
        return [self._completion_job(request, f"{request_id}-p{i}", prompt_ids)
                for i, prompt_ids in enumerate(prompt_id_lists)]

    def _completion_job(self, request: CompletionRequest, request_id: str, prompt_ids: list[int]) -> GenerationJob:
        params = with_defaults(sampling_fields(request), request.max_new_tokens, self.defaults,
                               self.max_num_request_tokens - len(prompt_ids))
        return GenerationJob(request_id=request_id, prompt_token_ids=prompt_ids, params=params,
                             stop_strings=tuple(request.stop or ()), num_choices=request.n,
                             cache_salt=request.cache_salt,
                             engine_options=requested_engine_options(request.document_reuse, request.speculation))

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.settings.served_model_name:
            raise APIError(404, f"model {model!r} does not exist; this server serves "
                                f"{self.settings.served_model_name!r}", param="model", code="model_not_found")

    def _check_capacity(self) -> None:
        num_waiting = self.engine.stats().num_waiting
        if num_waiting >= self.settings.max_waiting:
            raise APIError(503, f"the server is overloaded ({num_waiting} requests waiting); retry shortly",
                           code="overloaded", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    # ---- running ------------------------------------------------------------

    def generate(self, job: GenerationJob, usage: Usage) -> AsyncIterator[ChoiceDelta]:
        return self.runner.generate(job, usage)

    async def complete(self, job: GenerationJob, usage: Usage) -> list[ChoiceResult]:
        return await self.runner.complete(job, usage)

    def _keep_turn(self, job: GenerationJob, choice: FinishedChoice) -> None:
        """Remember a finished turn's ids for the next prompt; pin a tool-call turn's prefix and the
        request's cache breakpoints."""
        if choice.index == 0:
            for pin in job.pins:
                self.engine.pin(job.prompt_token_ids[:pin.num_tokens], job.cache_salt, pin.seconds)
        # A turn with a call cut off (max_tokens) cannot come back as the same message: not remembered.
        if not job.is_chat or choice.has_unfinished_call:
            return
        if self.turns is not None:
            # A stop token is the end of the turn, which the template writes itself.
            ids = choice.generated_ids
            turn_ids = ids[:-1] if choice.reason is FinishReason.STOP else ids
            self.turns.remember(message_content(choice.content, choice.calls), choice.calls, turn_ids, job.turn_scope)
        if choice.calls and self.settings.pins.tool_seconds > 0:
            self.engine.pin(job.prompt_token_ids + choice.generated_ids, job.cache_salt,
                            self.settings.pins.tool_seconds)


"""A legacy completion as one response: several prompts, each with its n choices, and `echo`.

    batch = CompletionBatch(jobs, n, echo_texts)       # jobs: one GenerationJob per prompt
    runner = CompletionBatchRunner(service)            # what `answer` drives, like CompletionService
    deltas = runner.generate(batch, usage)

Choices are indexed as OpenAI indexes them, prompt-major: prompt p's choice j is choice
p * n + j. Prompts run concurrently (each prompt's choices share its pages as usual); usage
is the sum over prompts.

Echo: each choice starts with its prompt's text. With `logprobs`, that first piece carries
the prompt tokens' logprobs (the first token's is null, as OpenAI reports it); the engine
computes them in prefill, without the prefix cache (see engine/prompt_logprobs.py), once
per prompt (choice 0) and every choice of the prompt repeats them.
"""

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from functools import partial

from server.completion_service import ChoiceDelta, ChoiceResult, CompletionService, GenerationJob, Usage
from server.interleave import interleave


@dataclass(frozen=True)
class CompletionBatch:
    jobs: tuple[GenerationJob, ...]  # one per prompt
    num_choices_per_prompt: int
    echo_texts: tuple[str, ...] | None = None  # per prompt, when echo

    @property
    def request_id(self) -> str:
        return self.jobs[0].request_id

    @property
    def num_choices(self) -> int:
        return len(self.jobs) * self.num_choices_per_prompt


class CompletionBatchRunner:
    """Runs a CompletionBatch with the surface `answer` uses: generate / complete."""

    def __init__(self, service: CompletionService):
        self.service = service

    async def complete(self, batch: CompletionBatch, usage: Usage) -> list[ChoiceResult]:
        results = [ChoiceResult(i) for i in range(batch.num_choices)]
        async with aclosing(self.generate(batch, usage)) as deltas:
            async for delta in deltas:
                results[delta.index].add(delta)
        return results

    async def generate(self, batch: CompletionBatch, usage: Usage) -> AsyncIterator[ChoiceDelta]:
        """Deltas of every choice of every prompt, re-indexed prompt-major, echo first."""
        usages = [Usage() for _ in batch.jobs]
        echo = _Echo(batch) if batch.echo_texts is not None else None
        async with aclosing(self._merged(batch, usages)) as deltas:
            async for prompt_index, delta in deltas:
                _sum_usage(usage, usages, batch.num_choices_per_prompt)
                delta = replace(delta, index=prompt_index * batch.num_choices_per_prompt + delta.index)
                if echo is not None:
                    echoed = echo.first_piece(prompt_index, delta)
                    if echoed is not None:
                        yield echoed
                yield delta

    async def _merged(self, batch: CompletionBatch, usages: list[Usage]
                      ) -> AsyncIterator[tuple[int, ChoiceDelta]]:
        """(prompt index, delta) as they come (server/interleave.py)."""

        async def prompt_deltas(prompt_index: int) -> AsyncIterator[tuple[int, ChoiceDelta]]:
            async with aclosing(self.service.generate(batch.jobs[prompt_index], usages[prompt_index])) as deltas:
                async for delta in deltas:
                    yield prompt_index, delta

        streams = [partial(prompt_deltas, i) for i in range(len(batch.jobs))]
        async with aclosing(interleave(streams, batch.jobs[0].request_id)) as deltas:
            async for item in deltas:
                yield item


def _sum_usage(total: Usage, usages: Sequence[Usage], n: int) -> None:
    total.num_prompt_tokens = sum(u.num_prompt_tokens for u in usages)
    total.num_cached_tokens = sum(u.num_cached_tokens for u in usages)
    total.num_reused_document_tokens = sum(u.num_reused_document_tokens for u in usages)
    for prompt_index, u in enumerate(usages):
        for choice, count in u.num_completion_tokens_by_choice.items():
            total.num_completion_tokens_by_choice[prompt_index * n + choice] = count
    first_times = [u.first_token_time for u in usages if u.first_token_time is not None]
    total.first_token_time = min(first_times) if first_times else None


class _Echo:
    """The prompt's text (and logprobs) as the first delta of each of its choices."""

    def __init__(self, batch: CompletionBatch):
        self._batch = batch
        self._started: set[int] = set()
        # per prompt: (logprobs, top_logprobs) from its choice 0's first delta
        self._prompt_logprobs: dict[int, tuple[list, list]] = {}

    def first_piece(self, prompt_index: int, delta: ChoiceDelta) -> ChoiceDelta | None:
        if delta.prompt_logprobs is not None:
            self._prompt_logprobs[prompt_index] = (delta.prompt_logprobs, delta.prompt_top_logprobs)
        if delta.index in self._started:
            return None
        self._started.add(delta.index)
        job = self._batch.jobs[prompt_index]
        logprobs = top_logprobs = None
        if job.params.prompt_logprobs is not None:
            # choice 0 of the prompt starts first (CompletionService), so its logprobs are here
            logprobs, top_logprobs = self._prompt_logprobs[prompt_index]
        return ChoiceDelta(delta.index, self._batch.echo_texts[prompt_index], list(job.prompt_token_ids),
                           logprobs, top_logprobs, None)

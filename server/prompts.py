"""Jobs and requests -> prompt token ids (chat through assembly's prompt builder)."""

from assembly.chat_template import TemplateError
from assembly.document_ranges import document_token_ranges
from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import PromptTooLong, SegmentTokenizer
from server.errors import invalid_request
from server.job import CacheBreakpoint, ChatJob
from server.schemas import CompletionRequest


class RequestPrompts:
    def __init__(self, builder: PromptBuilder):
        self.builder = builder
        self.segments: SegmentTokenizer = builder.tokenizer
        self.tokenizer = builder.tokenizer.tokenizer  # for decoding

    def job_prompt_ids(self, job: ChatJob, add_generation_prompt: bool = True,
                       max_num_tokens: int | None = None) -> list[int]:
        """Raises TemplateError when the template refuses these messages; a 400 when the prompt
        surely exceeds `max_num_tokens` (judged from its length, before tokenizing)."""
        try:
            token_ids = self._build(list(job.messages), job, add_generation_prompt, max_num_tokens)
        except PromptTooLong as error:
            raise invalid_request(f"messages: {error}", param="messages") from None
        return self._non_empty(token_ids, "messages")

    def _build(self, messages: list[dict], job: ChatJob, add_generation_prompt: bool,
               max_num_tokens: int | None = None) -> list[int]:
        return self.builder.build(messages, tools=[*job.tools] or None, documents=[*job.documents] or None,
                                  template_kwargs=job.template_kwargs, add_generation_prompt=add_generation_prompt,
                                  max_num_tokens=max_num_tokens, turn_scope=job.turn_scope)

    def document_ranges(self, job: ChatJob, prompt_ids: list[int]) -> tuple[tuple[int, int], ...]:
        """The token range of each of the job's documents' text in its prompt (those found): the exact
        spans of document KV reuse (assembly/document_ranges.py)."""
        if not job.documents:
            return ()
        return tuple(document_token_ranges(self.segments, prompt_ids, [document["text"] for document in job.documents]))

    def breakpoint_lengths(self, job: ChatJob, prompt_ids: list[int]) -> list[tuple[CacheBreakpoint, int]]:
        """Each breakpoint with the number of leading prompt tokens its prefix covers: the prompt
        rendered up to the breakpoint (no generation prompt), as far as it agrees with the whole
        prompt (a template closes the cut turn itself; those tokens are not the prompt's)."""
        lengths = []
        for breakpoint in job.cache_breakpoints:
            messages = list(job.messages)
            if breakpoint.message_index < 0:
                head = messages[:1] if messages and messages[0].get("role") == "system" else []
            else:
                head = messages[:breakpoint.message_index + 1]
                if breakpoint.content is not None and head:
                    head[-1] = {**head[-1], "content": breakpoint.content}
            try:
                prefix_ids = self._build(head, job, add_generation_prompt=False)
            except TemplateError:  # a template that refuses a cut conversation: no pin
                prefix_ids = []
            lengths.append((breakpoint, common_prefix_length(prefix_ids, prompt_ids)))
        return lengths

    def completion_prompt_ids(self, request: CompletionRequest, max_num_tokens: int | None = None) -> list[list[int]]:
        """One id list per prompt (a text is tokenized, ids are taken as they are); a 400 when a text
        surely exceeds `max_num_tokens` (judged from its length, before tokenizing)."""
        id_lists = []
        for i, prompt in enumerate(request.prompt):
            param = "prompt" if len(request.prompt) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                try:
                    self.segments.check_fits([prompt], max_num_tokens)
                except PromptTooLong as error:
                    raise invalid_request(f"{param}: {error}", param=param) from None
            id_lists.append(self._non_empty(self.segments.encode(prompt) if isinstance(prompt, str) else list(prompt),
                                            param))
        return id_lists

    def count_tokens(self, job: ChatJob, max_num_tokens: int | None = None) -> int:
        return len(self.job_prompt_ids(job, max_num_tokens=max_num_tokens))

    @staticmethod
    def _non_empty(token_ids: list[int], param: str) -> list[int]:
        if not token_ids:
            raise invalid_request(f"{param}: the prompt is empty", param=param)
        return token_ids


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n

"""The synchronous engine: add requests, call `step()` until they are done.

One step reads like the loop it is: draft, schedule, load KV, run, save KV, postprocess. The KV
sources (engine/kv_source.py: the disk tier, the document store) are asked by the scheduler at
admission and load / save around the forward pass; the drafter (engine/draft_proposer.py) keeps its
own state and hands the scheduler this step's drafts.
Not thread-safe: `AsyncEngine` owns it from a single thread.
"""

import dataclasses
import logging
import time
from pathlib import Path

import torch

from cache.document_spans import find_spans
from cache.document_store import DocumentKVStore, document_key
from cache.kv_pool import KVPool, KVPoolShape
from engine.document_kv_copy import DocumentKVCopier
from engine.document_kv_disk import open_document_kv_disk
from engine.document_reuse import DocumentReuse
from engine.backend_choice import backend_for
from engine.engine_config import EngineConfig, kv_pool_bytes, resolve_device, resolve_dtype
from engine.draft_proposer import DraftProposer
from engine.errors import RequestError
from engine.generate import stop_token_ids
from engine.heap import release_free_heap
from engine.kv_tier_link import open_disk_tier_link
from engine.engine_stats import engine_stats
from engine.metrics import EngineMetrics, EngineStats
from engine.model_runner import ModelRunner
from engine.prefix_pins import PrefixPins
from engine.prompt_logprobs import prompt_logprobs_output, record_prompt_logprobs
from engine.prompt_tail_logits import collect_tail_logits, record_tail_logits
from engine.request import FinishReason, Request, RequestOutput, RequestStatus
from engine.request_options import DEFAULT_REQUEST_OPTIONS, RequestOptions
from engine.sampler import Sampler, make_sampling_state
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledChunk, Scheduler
from engine.selective_recompute import SelectiveRecompute
from engine.heap_trim import trim_freed_heap
from engine.span_breaks import span_breaks
from engine.speculative_verify import AcceptedTokens, sample_and_verify
from kernels.kv_format import kv_dtype_name
from model.weights import check_weight_files, load_model


logger = logging.getLogger("radixserve.engine")

# Busy engines trim the heap this often too (engine/heap.py), not only when idle.
HEAP_TRIM_EVERY_STEPS = 512


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        model_dir = Path(config.model_dir)
        check_weight_files(model_dir)  # a corrupt file fails now, not after the backend compiled its kernels
        self.backend = backend_for(config, self.device, self.dtype, model_dir)
        # Before the weights: the tokenizer it decodes the vocabulary with is dropped, and its freed pages
        # (~90 MiB of a 128k vocabulary's, resident when this ran after the KV pool) go back at once.
        breaks = span_breaks(model_dir)
        trim_freed_heap()
        self.model = load_model(model_dir, self.device, self.dtype, self.backend, gguf_blocks=config.gguf_blocks,
                                max_model_len=config.max_model_len)
        trim_freed_heap()
        if config.max_num_batched_tokens is None:
            config = dataclasses.replace(config, max_num_batched_tokens=self.backend.policy.max_num_batched_tokens)
        self.config = config
        model_config = self.model.config
        self.vocab_size = model_config.vocab_size
        self.eos_token_ids = stop_token_ids(model_dir, model_config.eos_token_ids)
        self.max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                                 model_config.max_position_embeddings)

        shape = KVPoolShape(model_config.num_layers, model_config.num_kv_heads, model_config.head_dim,
                            config.page_size, self.dtype, *config.kv_dtype.resolve(kv_dtype_name(self.dtype)))
        pool_bytes, pool_reason = kv_pool_bytes(config, shape.bytes_per_page // config.page_size, self.max_model_len,
                                                self.device)
        num_pages = shape.num_pages_for(pool_bytes)
        if num_pages < 1:
            raise ValueError(f"a KV cache of {pool_bytes} bytes holds no page of {shape.bytes_per_page} bytes")
        self.kv_pool = KVPool(shape, num_pages, self.device)
        logger.info("radixserve: KV cache of %d tokens (%d pages), %.0f MiB, KV %s (%s)", num_pages * config.page_size,
                    num_pages, self.kv_pool.num_bytes / 2**20, shape.kv_dtype_label, pool_reason)
        self.metrics = EngineMetrics()
        self.kv_tier = None
        if config.kv_disk.directory is not None and config.enable_prefix_cache:
            self.kv_tier = open_disk_tier_link(config.kv_disk.directory, config.kv_disk.max_bytes, config.kv_disk.policy,
                                               model_dir, self.kv_pool, self.device.type, self.metrics)
        # Document KV (engine/document_reuse.py): spans' KV stored once, placed at any position; with the
        # disk tier, also on disk (engine/document_kv_disk.py), where a restarted engine finds it.
        self.document_disk = None
        if self.kv_tier is not None:
            self.document_disk = open_document_kv_disk(self.kv_tier.tier, config.documents.disk_bytes, shape,
                                                       self.device, self.metrics)
        self.document_store = DocumentKVStore(config.documents.store_bytes, self.document_disk)
        copier = DocumentKVCopier(self.document_store, self.kv_pool, self.backend, self.model.layer_inv_freqs,
                                  self.device)
        selective = None  # CacheBlend-style recompute of the most deviating placed tokens
        if config.documents.recompute_fraction > 0:
            selective = SelectiveRecompute(config.documents.recompute_fraction, self.model, self.kv_pool, self.device)
        self.documents = DocumentReuse(config, self.document_store, breaks, copier, selective)
        sources = [source for source in (self.kv_tier, self.documents) if source is not None]
        self.scheduler = Scheduler(config, num_pages, self.max_model_len, sources)
        if self.kv_tier is not None:
            self.scheduler.tree.page_listeners.append(self.kv_tier.on_page_event)  # its saves
        self.pins = PrefixPins(self.scheduler.tree)
        self.runner = ModelRunner(self.model, self.kv_pool, self.device)
        self.sampler = Sampler()
        self.proposer = None
        speculation = config.speculation
        if speculation.is_on:
            self.proposer = DraftProposer(speculation.mode, speculation.max_draft_tokens, speculation.suffix_index_tokens,
                                          self.backend.policy.verify_row_costs)
        self.num_steps = 0

    # ---- requests -------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
        options: RequestOptions = DEFAULT_REQUEST_OPTIONS,
    ) -> Request:
        """Queue a request; raises RequestError when it can never be served."""
        bad_span = next(((s, e) for s, e in options.document_spans if e > len(prompt_token_ids)), None)
        if bad_span is not None:
            raise RequestError(f"document span {list(bad_span)} lies outside the {len(prompt_token_ids)}-token prompt")
        ordered = sorted(options.document_spans)
        overlap = next((b for a, b in zip(ordered, ordered[1:]) if b[0] < a[1]), None)
        if overlap is not None:
            raise RequestError(f"document span {list(overlap)} overlaps another")
        bad = next((t for t in prompt_token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise RequestError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        params.check_vocab_size(self.vocab_size)
        if self.scheduler.find(request_id) is not None:
            raise RequestError(f"request id {request_id!r} is already in use")
        output_token_ids: list[int] = []
        state = make_sampling_state(params, list(prompt_token_ids), self.device, output_token_ids)
        request = Request(request_id, list(prompt_token_ids), state, cache_salt, options,
                          output_token_ids=output_token_ids)
        self.scheduler.add(request)
        return request

    def abort(self, request_id: str) -> bool:
        """Drop a request now; its pages go back before the next step."""
        request = self.scheduler.find(request_id)
        if request is None:
            return False
        self.scheduler.finish(request, FinishReason.ABORT)
        if self.proposer is not None:
            self.proposer.forget(request)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def close(self) -> None:
        """Finish the disk tier's queued writes (documents' too) and let go of its directory. Idempotent."""
        if self.document_disk is not None:
            self.document_disk.close()  # first: its files are in the directory the tier holds locked
        if self.kv_tier is not None:
            self.kv_tier.close()

    def pin_prefix(self, token_ids: list[int], cache_salt: str | None, seconds: float) -> int:
        """Keep the cached prefix of `token_ids` from eviction for `seconds` (e.g. a finished
        tool-call turn, until the tool's result comes back). Returns the tokens pinned."""
        if not self.scheduler.enable_prefix_cache:
            return 0
        return self.pins.pin(token_ids, cache_salt, seconds)

    # ---- one step -------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        self.pins.release_expired()
        drafts = self._propose_drafts()
        chunks = self.scheduler.schedule(drafts)
        if not chunks:
            return []
        self.num_steps += 1
        started = time.perf_counter()
        chunks = self._load_kv(chunks)
        logits, sampled_chunks, prompt_logits = self.runner.run(chunks)
        self._record_prompt_rows(prompt_logits)
        self.scheduler.commit(chunks)
        self._save_kv(chunks)
        outputs = self._postprocess(logits, sampled_chunks) if sampled_chunks else []
        self._account_step(chunks, time.perf_counter() - started)
        if not self.has_unfinished() or self.num_steps % HEAP_TRIM_EVERY_STEPS == 0:
            release_free_heap()
        return outputs

    def _propose_drafts(self) -> dict[Request, list[int]]:
        """Drafts for the running requests that speculate; the scheduler fits them in the budget."""
        drafts: dict[Request, list[int]] = {}
        if self.proposer is None:
            return drafts
        max_rows = (self.config.speculation.max_verify_rows_per_step
                    or self.backend.policy.max_verify_rows_per_step)
        running = [r for r in self.scheduler.admitted if r.status is RequestStatus.RUNNING]
        # drafts only while the step's rows stay where the backend's row costs hold (CPU: the few-rows kernels)
        num_free_rows = max_rows - len(running)
        for request in running:
            if num_free_rows <= 0:
                break
            if request.options.speculation is False:
                continue
            # never past max_tokens: a verify chunk emits up to 1 + len(drafts) tokens
            room = min(num_free_rows, request.sampling.params.max_tokens - len(request.output_token_ids) - 1)
            if room > 0:
                drafts[request] = self.proposer.propose(request, room)
                num_free_rows -= len(drafts[request])
        return drafts

    def _load_kv(self, chunks: list[ScheduledChunk]) -> list[ScheduledChunk]:
        """Before the forward pass: each KV source writes what it planned into pages (it may re-cut chunks)."""
        for source in self.scheduler.sources:
            chunks = source.load(chunks)
        return chunks

    def _save_kv(self, chunks: list[ScheduledChunk]) -> None:
        """After the forward pass and commit: each KV source keeps what it wants of the KV just computed."""
        for source in self.scheduler.sources:
            source.save(chunks)

    def _record_prompt_rows(self, prompt_logits) -> None:
        """Prompt rows' logits the step computed: tail logits, or prompt logprobs."""
        for request, position, rows in prompt_logits:
            if request.num_tail_logit_rows:
                record_tail_logits(request, position, rows)
            else:
                record_prompt_logprobs(request, position, rows)

    def _postprocess(self, logits: torch.Tensor, chunks: list[ScheduledChunk]) -> list[RequestOutput]:
        requests = [chunk.request for chunk in chunks]
        is_first_output = [not request.output_token_ids for request in requests]
        accepted = sample_and_verify(self.sampler, logits, requests, [c.draft_token_ids for c in chunks],
                                     self._finish_reason)
        now = time.perf_counter()
        outputs = []
        for chunk, request, result, is_first in zip(chunks, requests, accepted, is_first_output):
            if chunk.draft_token_ids:
                self._account_verify(chunk, result)
            self._observe_token(request, now)
            reason = result.finish_reason
            if reason is not None:
                if self.proposer is not None:
                    self.proposer.record_finished(request)
                self.scheduler.finish(request, reason)
                self.metrics.observe("e2e_latency", now - request.timings.arrival)
                self.metrics.num_finished_requests += 1
            wants_logprobs = request.sampling.params.logprobs is not None
            prompt_logprobs = prompt_top_logprobs = None
            if request.sampling.params.prompt_logprobs is not None and is_first:
                prompt_logprobs, prompt_top_logprobs = prompt_logprobs_output(request)
            outputs.append(
                RequestOutput(
                    request_id=request.request_id,
                    new_token_ids=result.token_ids,
                    logprobs=result.logprobs if wants_logprobs and result.logprobs else None,
                    top_logprobs=result.top_logprobs if wants_logprobs and result.logprobs else None,
                    finish_reason=reason,
                    num_prompt_tokens=len(request.prompt_token_ids),
                    num_cached_tokens=request.num_cached_tokens,
                    num_output_tokens=len(request.output_token_ids),
                    prompt_logprobs=prompt_logprobs,
                    prompt_top_logprobs=prompt_top_logprobs,
                    num_reused_document_tokens=request.num_reused_document_tokens,
                    num_disk_tier_tokens=request.num_disk_tier_tokens,
                    num_recomputed_document_tokens=request.num_recomputed_document_tokens,
                    num_draft_tokens=request.num_draft_tokens,
                    num_accepted_draft_tokens=request.num_accepted_draft_tokens,
                )
            )
        return outputs

    def _account_verify(self, chunk: ScheduledChunk, result: AcceptedTokens) -> None:
        """A verify chunk computed its last token and d drafts; the e tokens it emitted have KV for
        all but the last, so d + 1 - e computed tokens were rejected."""
        num_drafts = len(chunk.draft_token_ids)
        self.scheduler.discard_rejected(chunk.request, num_drafts + 1 - len(result.token_ids))
        self.proposer.observe(chunk.request, num_drafts, result.num_accepted_drafts)
        self.metrics.num_draft_tokens += num_drafts
        self.metrics.num_accepted_draft_tokens += result.num_accepted_drafts
        self.metrics.num_verify_chunks += 1
        chunk.request.num_draft_tokens += num_drafts
        chunk.request.num_accepted_draft_tokens += result.num_accepted_drafts

    def _finish_reason(self, request: Request, token_id: int) -> FinishReason | None:
        params = request.sampling.params
        if token_id in params.stop_token_ids or (not params.ignore_eos and token_id in self.eos_token_ids):
            return FinishReason.STOP
        if len(request.output_token_ids) >= params.max_tokens:
            return FinishReason.LENGTH
        return None

    def _observe_token(self, request: Request, now: float) -> None:
        timings = request.timings
        if timings.first_token is None:
            timings.first_token = now
            self.metrics.observe("time_to_first_token", now - timings.arrival)
            if timings.first_scheduled is not None:
                self.metrics.observe("queue_time", timings.first_scheduled - timings.arrival)
        else:
            self.metrics.observe("inter_token_latency", now - timings.last_token)
        timings.last_token = now

    def _account_step(self, chunks: list[ScheduledChunk], seconds: float) -> None:
        # A decode computes one token past the prompt, plus its drafts (a recompute after preemption counts
        # as prefill).
        decodes = [c for c in chunks
                   if c.num_tokens == 1 + len(c.draft_token_ids) and c.start >= len(c.request.prompt_token_ids)]
        num_decode = sum(c.num_tokens for c in decodes)
        num_tokens = sum(c.num_tokens for c in chunks)
        metrics = self.metrics
        metrics.num_decode_tokens += num_decode
        metrics.num_prefill_tokens += num_tokens - num_decode
        if len(decodes) == len(chunks):
            metrics.decode_seconds += seconds
        else:
            metrics.prefill_seconds += seconds

    # ---- introspection --------------------------------------------------

    def stats(self) -> EngineStats:
        return engine_stats(self)

    # ---- offline use (tests, benchmarks) --------------------------------

    def precompute_documents(self, token_id_lists: list[list[int]], cache_salt: str | None = None,
                             on_output=None, context_token_id_lists: list[list[int]] | None = None) -> int:
        """Compute each list and store its spans (find_spans with the whole list as one exact span)
        in the document store. Returns the prompt tokens computed; a list whose spans are all stored
        already costs nothing. Each list is computed after its context (`context_token_id_lists[i]`,
        e.g. the template's opening and the documents block's markup, as a prompt holds them), or
        alone from position 0 without one: its spans are stored at their real positions, the
        context's KV only goes to the prefix cache (exact KV, shared by lists with the same
        context). In context, a span's first token is no attention sink, as in a prompt. Steps the
        engine; `on_output` receives the outputs of other requests those steps produce (AsyncEngine
        delivers them)."""
        contexts = context_token_id_lists or [[] for _ in token_id_lists]
        if len(contexts) != len(token_id_lists):
            raise RequestError(f"{len(contexts)} contexts for {len(token_id_lists)} documents")
        empty = next((index for index, token_ids in enumerate(token_id_lists) if not token_ids), None)
        if empty is not None:
            raise RequestError(f"document {empty} is empty")
        num_computed = 0
        for index, (context, token_ids) in enumerate(zip(contexts, token_id_lists)):
            spans = find_spans(token_ids, [(0, len(token_ids))], self.config.documents.min_span_tokens,
                               self.documents.breaks)
            if all(document_key(token_ids[start:end], cache_salt) in self.document_store for start, end in spans):
                continue
            prompt = list(context) + list(token_ids)
            options = RequestOptions(document_reuse=True, document_spans=((len(context), len(prompt)),))
            request = self.add_request(f"precompute-{self.num_steps}-{index}-{id(token_id_lists)}", prompt,
                                       SamplingParams(max_tokens=1, temperature=0.0), cache_salt, options)
            request.document_store_start = len(context)  # read at admission: only the document's spans are stored
            while not request.is_finished:
                for output in self.step():
                    if output.request_id != request.request_id and on_output is not None:
                        on_output(output)
            num_computed += len(prompt) - request.num_cached_tokens
        return num_computed

    def prompt_tail_logits(self, prompt_token_ids: list[int], num_rows: int, cache_salt: str | None = None,
                           options: RequestOptions = DEFAULT_REQUEST_OPTIONS) -> torch.Tensor:
        """(num_rows, V) float32 logits of the prompt's last num_rows positions, run through the
        ordinary scheduled path (prefix match, document stitching, chunked prefill): row i scores
        prompt token len - num_rows + i + 1, the last row the first generated token. Those
        positions are computed for this request; everything before them may come from cache.
        Steps the engine until this request is done (meant for an idle engine)."""
        if not 1 <= num_rows <= len(prompt_token_ids):
            raise RequestError(f"num_rows must be in [1, {len(prompt_token_ids)}], got {num_rows}")
        request = self.add_request(f"tail-logits-{self.num_steps}-{id(prompt_token_ids)}", prompt_token_ids,
                                   SamplingParams(max_tokens=1, temperature=0.0), cache_salt, options)
        request.num_tail_logit_rows = num_rows  # read by the scheduler and the runner once admitted
        while not request.is_finished:
            self.step()
        return collect_tail_logits(request)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
        """Run prompts to completion together; returns each one's output ids."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        requests = [self.add_request(f"offline-{i}-{id(prompts)}", p, sp)
                    for i, (p, sp) in enumerate(zip(prompts, params_list))]
        while self.has_unfinished():
            self.step()
        return [list(r.output_token_ids) for r in requests]

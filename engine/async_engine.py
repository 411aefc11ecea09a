"""The engine loop in its own thread, and the asyncio handle the server uses.

Commands (add, abort, pin, precompute documents, read the cached prefixes) go in through a thread-safe queue; outputs come back to
each request's asyncio queue with `loop.call_soon_threadsafe`. torch releases
the GIL inside its ops, so the server's event loop stays responsive while a
step runs.
"""

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

from engine.cached_prefixes import CachedPrefix, cached_prefixes_now
from engine.engine_config import EngineConfig
from engine.engine_handle import EngineFacts
from engine.errors import RequestError
from engine.llm_engine import LLMEngine
from engine.metrics import EngineStats
from engine.request import RequestOutput
from engine.request_options import DEFAULT_REQUEST_OPTIONS, RequestOptions
from engine.sampling_params import SamplingParams

logger = logging.getLogger("radixserve.engine")
T = TypeVar("T")


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None
    options: RequestOptions
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Precompute:
    token_id_lists: list[list[int]]
    cache_salt: str | None
    loop: asyncio.AbstractEventLoop
    result: asyncio.Future
    context_token_id_lists: list[list[int]] | None = None


@dataclass(frozen=True)
class _ReadPrefixes:
    cache_salt: str | None
    limit: int
    loop: asyncio.AbstractEventLoop
    result: asyncio.Future


@dataclass(frozen=True)
class _Compute:
    work: Callable[[], object]
    done: concurrent.futures.Future


@dataclass(frozen=True)
class _Pin:
    token_ids: list[int]
    cache_salt: str | None
    seconds: float


class AsyncEngine:
    """One LLMEngine on its own thread: an engine.engine_handle.EngineHandle."""

    precompute_unavailable = None  # computes document KV into its own store
    cached_prefixes_unavailable = None  # its one tree is read between steps
    prometheus_collectors = ()  # every series it has is the server's own

    def __init__(self, engine: LLMEngine | Callable[[], LLMEngine]):
        """`engine`, or what builds it: then it is built on the engine thread (from_config), before
        __init__ returns (or raises what building raised)."""
        self._commands: queue.Queue = queue.Queue()
        # request_id -> (loop, asyncio.Queue); touched by the engine thread only.
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopping = threading.Event()
        self._stop_lock = threading.Lock()
        built: queue.Queue = queue.Queue(maxsize=1)  # (facts, metrics) once built, or what building raised
        build = engine if callable(engine) else (lambda: engine)
        self._thread = threading.Thread(target=self._build_and_run, args=(build, built), name="radixserve-engine",
                                        daemon=True)
        self._thread.start()
        outcome = built.get()
        if isinstance(outcome, BaseException):
            self._thread.join()
            raise outcome
        self.facts, self.metrics = outcome  # the server's histograms listen to the metrics

    @classmethod
    def from_config(cls, config: EngineConfig) -> "AsyncEngine":
        # Built on the thread that runs its steps. The kernels parallelize with OpenMP, whose runtime keeps a team
        # of workers per thread that starts parallel work: loading on one thread and stepping on another made two
        # teams, more OpenMP threads than cores, and a 1B model's decode steps ran 1.3x as long (2 cores;
        # docs/performance.md, "One thread for the engine").
        return cls(lambda: LLMEngine(config))

    # ---- asyncio side ---------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
        affinity_key: str | None = None,
        options: RequestOptions = DEFAULT_REQUEST_OPTIONS,
    ) -> AsyncIterator[RequestOutput]:
        """Yields one RequestOutput per generated token; the last one carries
        finish_reason. Raises RequestError if the engine refuses the request.
        Leaving the iteration early (client gone) aborts the request.
        `affinity_key` (prompt_cache_key) is a routing hint for replicas
        (ReplicaEngine); one in-process engine does not need it."""
        outputs: asyncio.Queue = asyncio.Queue()
        self._commands.put(_Add(request_id, prompt_token_ids, params, cache_salt, options,
                                 asyncio.get_running_loop(), outputs))
        finished = False
        try:
            while True:
                item = await outputs.get()
                if isinstance(item, Exception):
                    finished = True
                    raise item
                yield item
                if item.finish_reason is not None:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    def pin(self, token_ids: list[int], cache_salt: str | None, seconds: float) -> None:
        """Keep this prefix's cached pages from eviction for `seconds` (LLMEngine.pin_prefix)."""
        self._commands.put(_Pin(list(token_ids), cache_salt, seconds))

    async def precompute_documents(self, token_id_lists: list[list[int]], cache_salt: str | None = None,
                                   context_token_id_lists: list[list[int]] | None = None) -> int:
        """Store each list's span KV, each computed after its context if given
        (LLMEngine.precompute_documents), run on the engine thread between steps; other requests'
        outputs keep flowing meanwhile. Returns the prompt tokens computed. Raises RequestError when
        a list can never be served (empty, too long)."""
        loop = asyncio.get_running_loop()
        result = loop.create_future()
        contexts = None if context_token_id_lists is None else [list(ids) for ids in context_token_id_lists]
        self._commands.put(_Precompute([list(ids) for ids in token_id_lists], cache_salt, loop, result, contexts))
        return await result

    async def cached_prefixes(self, cache_salt: str | None, limit: int) -> tuple[float, list[CachedPrefix]]:
        """(unix time, the tenant's `limit` longest cached prefixes), read on the engine thread between
        steps (engine/cached_prefixes.py)."""
        loop = asyncio.get_running_loop()
        result = loop.create_future()
        self._commands.put(_ReadPrefixes(cache_salt, limit, loop, result))
        return await result

    def run_compute(self, work: Callable[[], T]) -> T:
        """Runs `work` on the engine thread between steps and returns what it returned (or raises what it
        raised); blocks the calling thread, never the engine. The process's other parallel torch work (the
        embedding model) comes through here, so that one thread starts OpenMP's parallel regions (see
        from_config): one /v1/embeddings call run on an executor thread left decode at half its speed."""
        if threading.current_thread() is self._thread:
            return work()
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._stop_lock:  # queued before shutdown drains the queue, or refused
            if self._stopping.is_set():
                raise RuntimeError("the engine is stopped")
            self._commands.put(_Compute(work, done))
        return done.result()

    def stats(self) -> EngineStats:
        """The snapshot taken after the latest step (never blocks on the engine)."""
        return self._stats

    def shutdown(self) -> None:
        with self._stop_lock:
            self._stopping.set()
        self._commands.put(None)
        self._thread.join(timeout=30)
        self._fail_pending_compute()
        if not self._thread.is_alive():
            self.engine.close()  # the disk tier's last writes; only once the engine thread is done with it

    # ---- engine thread --------------------------------------------------

    def _build_and_run(self, build: Callable[[], LLMEngine], built: queue.Queue) -> None:
        try:  # the engine, and what __init__ publishes of it, before the first step
            engine = build()
            num_pool_tokens = engine.scheduler.allocator.num_pages * engine.config.page_size
            facts = EngineFacts(engine.vocab_size, engine.eos_token_ids, engine.max_model_len,
                                min(engine.max_model_len, num_pool_tokens), engine.backend.name,
                                engine.backend.describe(), engine.config.page_size)
            self.engine, self._stats = engine, engine.stats()
        except BaseException as error:  # __init__ raises it in the caller's thread
            built.put(error)
            return
        built.put((facts, engine.metrics))
        self._run()

    def _run(self) -> None:
        while not self._stopping.is_set():
            # Block while idle (until the next pin expires, if any); drain without blocking while there is work.
            self._handle(self._next_command() if not self.engine.has_unfinished() else None)
            self._drain_commands()
            self._stats = self.engine.stats()
            if self._stopping.is_set():
                break
            try:
                outputs = self.engine.step()
            except Exception:  # a fault must not kill the loop: fail the running requests
                logger.exception("engine step failed; failing its requests")
                self._fail_all("internal engine error")
                continue
            for output in outputs:
                self._deliver(output)
            self._stats = self.engine.stats()

    def _next_command(self):
        try:
            return self._commands.get(timeout=self.engine.pins.seconds_to_next_expiry())
        except queue.Empty:
            return None

    def _drain_commands(self) -> None:
        for command in self._queued_commands():
            self._handle(command)

    def _queued_commands(self):
        """The commands queued now, taken off the queue one at a time (never blocks)."""
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _handle(self, command) -> None:
        if isinstance(command, _Add):
            try:
                self.engine.add_request(command.request_id, command.prompt_token_ids, command.params,
                                        command.cache_salt, command.options)
            except RequestError as error:
                command.loop.call_soon_threadsafe(command.outputs.put_nowait, error)
                return
            self._streams[command.request_id] = (command.loop, command.outputs)
        elif isinstance(command, _Abort):
            self.engine.abort(command.request_id)
            self._streams.pop(command.request_id, None)
        elif isinstance(command, _Pin):
            self.engine.pin_prefix(command.token_ids, command.cache_salt, command.seconds)
        elif isinstance(command, _Compute):
            try:
                command.done.set_result(command.work())
            except BaseException as error:  # the caller gets it; the loop goes on
                command.done.set_exception(error)
        elif isinstance(command, _Precompute):
            self._precompute(command)
        elif isinstance(command, _ReadPrefixes):
            try:
                outcome = cached_prefixes_now(self.engine, command.cache_salt, command.limit)
            except Exception as error:  # a fault must not kill the loop: the caller gets it
                logger.exception("reading the cached prefixes failed")
                outcome = error
            command.loop.call_soon_threadsafe(_settle, command.result, outcome)

    def _precompute(self, command: _Precompute) -> None:
        try:
            outcome = self.engine.precompute_documents(command.token_id_lists, command.cache_salt,
                                                       on_output=self._deliver,
                                                       context_token_id_lists=command.context_token_id_lists)
        except RequestError as error:
            outcome = error
        except Exception as error:  # a fault must not kill the loop: the caller gets it
            logger.exception("precomputing documents failed")
            outcome = error
        command.loop.call_soon_threadsafe(_settle, command.result, outcome)

    def _deliver(self, output: RequestOutput) -> None:
        stream = self._streams.get(output.request_id)
        if stream is None:
            return
        loop, outputs = stream
        if output.finish_reason is not None:
            del self._streams[output.request_id]
        try:
            loop.call_soon_threadsafe(outputs.put_nowait, output)
        except RuntimeError:  # the client's event loop is closed
            self.engine.abort(output.request_id)

    def _fail_pending_compute(self) -> None:
        """After the loop ended: work queued for it will never run; its callers get an error."""
        for command in self._queued_commands():
            if isinstance(command, _Compute):
                command.done.set_exception(RuntimeError("the engine is stopped"))

    def _fail_all(self, message: str) -> None:
        for request_id, (loop, outputs) in list(self._streams.items()):
            self.engine.abort(request_id)
            try:
                loop.call_soon_threadsafe(outputs.put_nowait, RuntimeError(message))
            except RuntimeError:
                pass
        self._streams.clear()


def _settle(future: asyncio.Future, outcome) -> None:
    """Resolve a caller's future unless the caller gave up on it (cancelled)."""
    if future.done():
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)

"""Drive workloads against one OpenAI-compatible endpoint: warm-up, concurrency or request rate,
a progress bar, and every request's outcome.

Concurrency bounds the sessions in flight (for single-turn workloads: requests in flight);
under a request rate, sessions start at gamma-distributed times (bench/arrivals.py) and the
concurrency still bounds them. A session whose request fails stops there: its later turns
would need the reply it did not get.
"""

import asyncio
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from tqdm import tqdm

from bench.arrivals import arrival_offsets_s
from bench.metrics import BenchSummary, RequestOutcome, summarize
from bench.openai_stream import stream_chat
from bench.workload import ChatRequest, Session, Workload

NUM_WARMUP_WORDS = 12
WARMUP_MAX_TOKENS = 4


@dataclass(frozen=True)
class RunOptions:
    concurrency: int = 4
    request_rate: float = math.inf  # sessions started per second
    burstiness: float = 1.0
    seed: int = 0
    num_warmup: int = 2
    ignore_eos: bool = True
    timeout_s: float = 300.0  # per request
    api_key: str | None = None
    show_progress: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.num_warmup < 0 or self.timeout_s <= 0:
            raise ValueError("concurrency must be >= 1, num_warmup >= 0, timeout_s > 0")


@dataclass(frozen=True)
class WorkloadRun:
    workload: str
    description: str
    outcomes: tuple[RequestOutcome, ...]
    summary: BenchSummary


class EndpointUnreachable(Exception):
    """The endpoint refused, timed out or rejected the model listing; the message is one line."""


def open_client(base_url: str, options: RunOptions) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    return httpx.AsyncClient(base_url=base_url, headers=headers,
                             timeout=httpx.Timeout(options.timeout_s, connect=10.0),
                             limits=httpx.Limits(max_connections=options.concurrency + 4))


async def discover_model(client: httpx.AsyncClient) -> str:
    """The first model the endpoint lists; raises EndpointUnreachable with one clear line."""
    url = client.base_url.join("/v1/models")
    try:
        response = await client.get("/v1/models")
    except httpx.HTTPError as error:
        raise EndpointUnreachable(f"cannot reach {url} ({type(error).__name__}: {error or 'no detail'}); "
                                  "is the server running?") from None
    if response.status_code != 200:
        raise EndpointUnreachable(f"{url} answered HTTP {response.status_code}: {' '.join(response.text.split())[:200]}")
    models = response.json().get("data") or []
    if not models:
        raise EndpointUnreachable(f"{url} lists no models")
    return models[0]["id"]


async def warm_up(client: httpx.AsyncClient, model: str, options: RunOptions) -> list[str]:
    """Short unrelated requests before timing (connections, lazy initialisation); returns their errors."""
    errors = []
    for i in range(options.num_warmup):
        words = " ".join(f"warmup{i}-{j}" for j in range(NUM_WARMUP_WORDS))
        request = ChatRequest(({"role": "user", "content": f"Repeat: {words}"},), WARMUP_MAX_TOKENS)
        reply = await stream_chat(client, request, model=model, ignore_eos=options.ignore_eos,
                                  session_index=-1, turn_index=i, run_started_s=time.perf_counter())
        if reply.outcome.error:
            errors.append(reply.outcome.error)
    return errors


async def run_workload(client: httpx.AsyncClient, workload: Workload, *, model: str, options: RunOptions,
                       label: str = "") -> WorkloadRun:
    outcomes: list[RequestOutcome] = []
    semaphore = asyncio.Semaphore(options.concurrency)
    offsets_s = arrival_offsets_s(len(workload.sessions), options.request_rate, options.burstiness, options.seed)
    progress = tqdm(total=workload.num_requests, desc=f"{label} {workload.name}".strip(), unit="req",
                    disable=not options.show_progress, file=sys.stderr, leave=True)
    run_started_s = time.perf_counter()

    async def run_session(session_index: int, session: Session, offset_s: float) -> None:
        await asyncio.sleep(max(0.0, offset_s - (time.perf_counter() - run_started_s)))
        async with semaphore:
            request, turn_index = session.first_request(), 0
            while request is not None:
                reply = await stream_chat(client, request, model=model, ignore_eos=options.ignore_eos,
                                          session_index=session_index, turn_index=turn_index,
                                          run_started_s=run_started_s)
                outcomes.append(reply.outcome)
                progress.update(1)
                if not reply.outcome.is_success:
                    progress.update(session.num_turns - turn_index - 1)  # the turns it will not send
                    return
                request, turn_index = session.next_request(reply.text), turn_index + 1

    try:
        await asyncio.gather(*(run_session(i, s, o) for i, (s, o) in enumerate(zip(workload.sessions, offsets_s))))
    finally:
        progress.close()
    duration_s = time.perf_counter() - run_started_s
    outcomes.sort(key=lambda o: o.start_s)
    return WorkloadRun(workload.name, workload.description, tuple(outcomes), summarize(outcomes, duration_s))


def failure_line(run: WorkloadRun) -> str | None:
    """One line about failed requests, or None when all succeeded."""
    s = run.summary
    if s.num_failed == 0:
        return None
    return (f"{run.workload}: {s.num_failed} of {s.num_failed + s.num_completed} requests failed; "
            f"first errors: {' | '.join(s.first_errors)}")


async def run_workloads(base_url: str, workloads: Sequence[Workload], options: RunOptions,
                        label: str = "", model: str | None = None) -> tuple[str, list[WorkloadRun]]:
    """(model name, one run per workload), in order. Raises EndpointUnreachable before any timing."""
    async with open_client(base_url, options) as client:
        model = model or await discover_model(client)
        for error in await warm_up(client, model, options):
            print(f"warning: a warm-up request to {base_url} failed: {error}", file=sys.stderr)
        runs = []
        for workload in workloads:
            run = await run_workload(client, workload, model=model, options=options, label=label)
            if (line := failure_line(run)) is not None:
                print(f"warning: {label} {line}", file=sys.stderr)
            runs.append(run)
        return model, runs

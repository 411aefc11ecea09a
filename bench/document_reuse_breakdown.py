"""Where a RAG request's computed prompt tokens go with document reuse on, token by token.

    .venv/bin/python -m bench.document_reuse_breakdown [--concurrency 4] [--boundary-tokens K] [--skip-reuse-off]

In-process, on one engine as `serve` configures it: the suite's `rag` workload (documents pasted
into the system message), then a collection of the `rag_collection` passages, precomputed as ingest
does (server/document_precompute.py), then `rag_collection` (documents by search top-k, exact spans).
Requests run at the bench's concurrency: a new one is added as soon as one finishes, as the bench's
client does. At each admission the plan is recorded (`DocumentReuse.admit` observed) and every prompt
token is given one class:

  not computed: tree (exact prefix), derived (derived tree pages), placed (document store)
  computed:     boundary   the first k tokens of a reused span (and its tokens at the prompt's end)
                concurrent a span not stored yet that another admitted request is computing now
                new        a span seen for the first time (or evicted)
                recut      a `new` span's token inside a document an earlier request had already
                           computed: its span was cut differently there (or ran across its edges)
                gap        tokens between spans (markup, pieces under the minimum span length)
                tail       tokens after the last span (template, question, generation prompt)

Token counts are exact (no timing involved); the totals equal the engine's computed tokens.
Per request, the medians of computed tokens are printed too, with reuse on, with reuse off, and
the floor no reuse scheme goes under: spans no request computed before (new) and the tail. TTFT
grows with a request's computed tokens, so TTFT p50 follows the median request's.
"""

import argparse
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from assembly.chat_template import ChatTemplate
from assembly.document_ranges import document_token_ranges
from assembly.prompt_builder import PromptBuilder
from assembly.segment_tokenizer import SegmentTokenizer
from assembly.tokenizer import Tokenizer
from bench import corpus
from bench.rag_collection_workload import COLLECTION, collection_passages, rag_collection_workload
from bench.workload_sizes import WorkloadSizes
from bench.workloads import build_workload
from engine.document_reuse_config import DocumentReuseConfig
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.request import Request
from engine.request_options import RequestOptions
from engine.sampling_params import SamplingParams
from retrieval.collections import Collections, NewDocument
from server.document_precompute import precompute_token_ids
from server.rag_context import prompt_document
from server.retrieval_service import load_default_embedder
from store.model_store import pull

COMPUTED_CLASSES = ("boundary", "concurrent", "new", "recut", "gap", "tail")
CACHED_CLASSES = ("tree", "derived", "placed")
FLOOR_CLASSES = ("new", "tail")  # computed by any reuse scheme: what no request saw before, and what is new
KV_CACHE_BYTES = 1 << 30  # both workloads' prompts fit: nothing is evicted


@dataclass
class PromptJob:
    token_ids: list[int]
    exact_spans: tuple[tuple[int, int], ...]
    document_ranges: list[tuple[int, int, str]]  # (start, end, document name) of each document's text


@dataclass
class Breakdown:
    classes: Counter = field(default_factory=Counter)
    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_reused_spans: int = 0
    num_waits: int = 0  # admissions deferred by the scheduler (requests that waited a step)
    computed_per_request: list[int] = field(default_factory=list)
    floor_per_request: list[int] = field(default_factory=list)  # first-seen spans + tail of each request


class PlanObserver:
    """Classifies each admitted request's prompt tokens from its document plan."""

    def __init__(self, engine: LLMEngine, jobs: dict[str, PromptJob]):
        self.engine, self.jobs = engine, jobs
        self.breakdown = Breakdown()
        self.computed_documents: set[str] = set()  # documents an admitted request has computed or placed
        self._admit = engine.documents.admit
        engine.documents.admit = self.admit

    def admit(self, request: Request, tree, max_num_pages: int) -> None:
        num_exact = request.num_computed_tokens
        self._admit(request, tree, max_num_pages)
        if request.timings.first_scheduled is not None or request.request_id not in self.jobs:
            return  # a preempted request coming back, or a precompute
        job = self.jobs[request.request_id]
        prompt = request.prompt_token_ids
        labels = ["tail"] * len(prompt)
        prefix_end = request.num_computed_tokens
        for index in range(prefix_end):
            labels[index] = "tree" if index < num_exact else "derived"
        plan = request.document_plan
        in_flight = self.engine.documents.spans_in_flight(
            [other for other in self.engine.scheduler.admitted if other is not request])
        spans = request.found_spans  # the plan found them (every request here has reuse on)
        last_span_end = spans[-1][1] if spans else prefix_end
        for index in range(prefix_end, last_span_end):
            labels[index] = "gap"
        to_store = {(s.start, s.end) for s in plan.to_store} if plan is not None else set()
        for start, end in spans:
            if end <= prefix_end:
                continue
            if (start, end) in to_store:
                label = "concurrent" if in_flight.has(request.cache_salt, prompt[start:end]) else "new"
            else:
                label = "boundary"
            for index in range(max(start, prefix_end), end):
                labels[index] = label
        for copy in plan.copies if plan is not None else ():
            for index in range(copy.start, copy.start + copy.num_tokens):
                labels[index] = "placed"
        for start, end, name in job.document_ranges:
            if name in self.computed_documents:
                for index in range(start, end):
                    if labels[index] == "new":
                        labels[index] = "recut"
        self.computed_documents.update(name for _, _, name in job.document_ranges)
        counts = Counter(labels)
        self.breakdown.classes.update(counts)
        self.breakdown.computed_per_request.append(sum(counts[label] for label in COMPUTED_CLASSES))
        self.breakdown.floor_per_request.append(sum(counts[label] for label in FLOOR_CLASSES))
        self.breakdown.num_requests += 1
        self.breakdown.num_prompt_tokens += len(prompt)
        self.breakdown.num_reused_spans += plan.num_reused_spans if plan is not None else 0


def run_concurrently(engine: LLMEngine, jobs: dict[str, PromptJob], concurrency: int, max_tokens: int) -> list[int]:
    """The bench client's way: up to `concurrency` requests in flight, the next added as one ends.
    Returns each request's computed prompt tokens."""
    pending = list(jobs.items())
    in_flight: list[Request] = []
    requests: list[Request] = []
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    while pending or in_flight:
        while pending and len(in_flight) < concurrency:
            request_id, job = pending.pop(0)
            in_flight.append(engine.add_request(request_id, job.token_ids, params,
                                                options=RequestOptions(document_spans=job.exact_spans)))
            requests.append(in_flight[-1])
        engine.step()
        in_flight = [r for r in in_flight if not r.is_finished]
    return [len(r.prompt_token_ids) - r.num_cached_tokens for r in requests]


def rag_jobs(builder: PromptBuilder, sizes: WorkloadSizes, seed: int) -> dict[str, PromptJob]:
    docs = corpus.documents(sizes.rag_num_corpus_documents, sizes.rag_document_words)
    jobs = {}
    for index, session in enumerate(build_workload("rag", sizes, seed).sessions):
        messages = list(session.request.messages)
        token_ids = builder.build(messages)
        texts = [(f"rag-{rank}", text) for rank, text in enumerate(docs) if text in messages[0]["content"]]
        ranges = document_token_ranges(builder.tokenizer, token_ids, [text for _, text in texts])
        jobs[f"rag-{index}"] = PromptJob(token_ids, (), [(s, e, name) for (s, e), (name, _) in zip(ranges, texts)])
    return jobs


def collection_jobs(builder: PromptBuilder, collections: Collections, sizes: WorkloadSizes,
                    seed: int) -> dict[str, PromptJob]:
    """As server/rag_context.py builds them (relevance order, serve's default)."""
    jobs = {}
    for index, session in enumerate(rag_collection_workload(sizes, seed).sessions):
        chat = session.request
        spec = chat.extra_body["retrieval"]
        hits = collections.search(COLLECTION, spec["query"], spec["top_k"])
        documents = [prompt_document(hit.chunk_id, hit.text, hit.metadata) for hit in hits]
        token_ids = builder.build(list(chat.messages), documents=documents)
        spans = tuple(document_token_ranges(builder.tokenizer, token_ids, [d["text"] for d in documents]))
        jobs[f"collection-{index}"] = PromptJob(token_ids, spans,
                                                [(s, e, d["id"]) for (s, e), d in zip(spans, documents)])
    return jobs


def report(name: str, breakdown: Breakdown, reuse_off_per_request: list[int] | None) -> str:
    classes = breakdown.classes
    num_computed = sum(classes[c] for c in COMPUTED_CLASSES)
    per = max(1, breakdown.num_requests)
    lines = [f"## {name}: {breakdown.num_requests} requests, {breakdown.num_prompt_tokens} prompt tokens, "
             f"{num_computed} computed ({num_computed / per:.0f} per request), "
             f"{breakdown.num_reused_spans} spans reused"]
    if reuse_off_per_request:
        num_reuse_off_computed = sum(reuse_off_per_request)
        lines[0] += f"; reuse off computes {num_reuse_off_computed} ({num_computed / num_reuse_off_computed:.3f}x)"
    lines += ["", "| class | tokens | per request | share of computed |", "|---|---:|---:|---:|"]
    for label in COMPUTED_CLASSES + CACHED_CLASSES:
        share = f"{classes[label] / num_computed:.1%}" if label in COMPUTED_CLASSES and num_computed else "-"
        lines.append(f"| {label} | {classes[label]} | {classes[label] / per:.1f} | {share} |")
    if breakdown.computed_per_request:
        median_on = statistics.median(breakdown.computed_per_request)
        median_floor = statistics.median(breakdown.floor_per_request)
        line = f"Median computed per request: {median_on:.0f} with reuse on, floor {median_floor:.0f} (first seen + tail)"
        if reuse_off_per_request:
            median_off = statistics.median(reuse_off_per_request)
            line += (f", {median_off:.0f} with reuse off: on / off {median_on / median_off:.3f}x, "
                     f"floor / off {median_floor / median_off:.3f}x")
        lines += ["", line + "."]
    return "\n".join(lines)


def engine_for(model_dir: Path, args: argparse.Namespace, document_reuse: bool) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=model_dir, device="cpu", max_num_seqs=args.concurrency,
                                  kv_cache_bytes=KV_CACHE_BYTES,
                                  documents=DocumentReuseConfig(enabled=document_reuse,
                                                                boundary_tokens=args.boundary_tokens)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--boundary-tokens", type=int, default=DocumentReuseConfig().boundary_tokens)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-reuse-off", action="store_true", help="do not run reuse off for the ratio")
    args = parser.parse_args(argv)
    sizes = WorkloadSizes()
    model_dir = pull(args.model)
    builder = PromptBuilder(SegmentTokenizer(Tokenizer(model_dir)), ChatTemplate.from_model_dir(model_dir))
    passages = collection_passages(sizes)
    with tempfile.TemporaryDirectory(prefix="doc-reuse-breakdown-") as root:
        collections = Collections(Path(root), load_default_embedder)
        collections.create(COLLECTION)
        collections.add_documents(COLLECTION, [NewDocument(text, id=f"doc-{i + 1}") for i, text in enumerate(passages)])
        chunks = collections.document_chunks(COLLECTION, [f"doc-{i + 1}" for i in range(len(passages))])
        chunk_documents = [prompt_document(c.name, c.text, c.metadata) for c in chunks]
        workloads = {"rag": rag_jobs(builder, sizes, args.seed),
                     "rag_collection": collection_jobs(builder, collections, sizes, args.seed)}
        collections.close()
    reuse_off = {}
    if not args.skip_reuse_off:
        engine = engine_for(model_dir, args, False)
        for name, jobs in workloads.items():
            reuse_off[name] = run_concurrently(engine, jobs, args.concurrency, sizes.max_tokens)
        del engine
    engine = engine_for(model_dir, args, True)
    observer = PlanObserver(engine, {})
    for name, jobs in workloads.items():
        if name == "rag_collection":
            context_ids, token_id_lists = precompute_token_ids(builder, chunk_documents)
            num = engine.precompute_documents(token_id_lists, None, context_token_id_lists=context_ids)
            print(f"precomputed {len(chunk_documents)} chunks: {num} tokens", file=sys.stderr)
        observer.jobs, observer.breakdown = jobs, Breakdown()
        run_concurrently(engine, jobs, args.concurrency, sizes.max_tokens)
        print(report(name, observer.breakdown, reuse_off.get(name)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What travels between the ingress and a replica: token ids and page hashes, never KV or text.

The ingress has done auth, validation, retrieval, assembly and tokenization; a replica gets
a ReplicaWork (prompt ids, sampling params, salt, grammars, the prompt's chained page hashes
for the router) and streams back ReplicaReply items (the engine's RequestOutput, or the
engine's refusal). Grammar logits processors (llguidance matchers) cannot be pickled: they
travel as their grammar text and the replica compiles them again.
"""

from dataclasses import dataclass, field, replace

from assembly.constrained_output import GrammarLogitsProcessor
from engine.errors import RequestError
from engine.request import RequestOutput
from engine.request_options import DEFAULT_REQUEST_OPTIONS, RequestOptions
from engine.sampling_params import SamplingParams


class _RoutingStaysLocal:
    """For work with a `routing` field: the ingress's routing state, read by the Ray request router
    in the same process before the work is sent; never pickled (it is None on the other side)."""

    def __getstate__(self):
        state = dict(self.__dict__)
        state["routing"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)


@dataclass(frozen=True)
class ReplicaWork(_RoutingStaysLocal):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams  # without logits processors: see grammars
    cache_salt: str | None
    grammars: tuple[str, ...]  # llguidance grammars to run as logits processors, in order
    page_hashes: list[bytes]  # chained hashes of the prompt's full pages (cache/page_hash.py): routing only
    affinity_key: str | None  # prompt_cache_key or session header: routing only
    options: RequestOptions = DEFAULT_REQUEST_OPTIONS
    # In-process only: the ingress's routing state, read by the Ray request router in the same
    # process before the work is sent; never pickled (__getstate__ drops it).
    routing: object | None = field(default=None, compare=False)


def split_grammars(params: SamplingParams) -> tuple[SamplingParams, tuple[str, ...]]:
    """Params without their logits processors, and the grammars those were. Raises RequestError
    for any other processor (an arbitrary callable cannot travel to another process)."""
    grammars = []
    for processor in params.logits_processors:
        if not isinstance(processor, GrammarLogitsProcessor):
            raise RequestError("only grammar logits processors can run on a replica")
        grammars.append(processor.grammar)
    return replace(params, logits_processors=()), tuple(grammars)


@dataclass(frozen=True)
class ReplicaReply:
    """One streamed item: an engine output, or the engine's refusal of the request."""

    replica_id: str
    output: RequestOutput | None = None
    refusal: str | None = None  # RequestError message: raised again at the ingress



@dataclass(frozen=True)
class PrecomputeWork(_RoutingStaysLocal):
    """Document KV for one replica to compute into its own store (and its disk directory): the
    router sends it to `replica_id` (replicas/ray_router.py), so the ingress reaches every replica."""

    replica_id: str  # the target, as it reports itself (ReplicaID.unique_id)
    token_id_lists: list[list[int]]
    cache_salt: str | None
    # In-process only, as ReplicaWork's: binds the router to the ingress's state (never pickled).
    routing: object | None = field(default=None, compare=False)
    context_token_id_lists: list[list[int]] | None = None  # what each list is computed after (None: alone)

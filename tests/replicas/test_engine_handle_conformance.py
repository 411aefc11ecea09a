"""Both engine handles implement engine/engine_handle.py's EngineHandle, signatures included (no Ray needed)."""

import ast
import asyncio
import dataclasses
import inspect
import sys
import textwrap

import pytest

from engine.async_engine import AsyncEngine
from engine.engine_handle import EngineFacts, EngineHandle
from engine.metrics import EngineStats
from replicas.prefix_policy import PrefixRoutingPolicy
from replicas.replica_engine import ReplicaEngine
from replicas.routing_state import RoutingState
from replicas.work import PrecomputeWork

HANDLES = (AsyncEngine, ReplicaEngine)


def _protocol_methods() -> list[str]:
    return [name for name, value in vars(EngineHandle).items()
            if inspect.isfunction(value) and not name.startswith("_")]


def _protocol_attributes() -> list[str]:
    return list(EngineHandle.__annotations__)


def _instance_attributes(handle: type) -> set[str]:
    """Attributes the class declares, or its __init__ assigns (`self.name = ...`)."""
    names = {name for name in dir(handle) if not name.startswith("__")}
    source = textwrap.dedent(inspect.getsource(handle.__init__))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and (
                isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
    return names


def _call_kind(function) -> str:
    if inspect.isasyncgenfunction(function):
        return "async iterator"
    if inspect.iscoroutinefunction(function):
        return "coroutine"
    return "plain"


def conformance_errors(handle: type) -> list[str]:
    """What `handle` lacks or declares differently from EngineHandle: one line each."""
    errors = []
    for name in _protocol_methods():
        expected = getattr(EngineHandle, name)
        actual = getattr(handle, name, None)
        if actual is None:
            errors.append(f"{handle.__name__}.{name} is missing")
            continue
        if inspect.signature(actual) != inspect.signature(expected):
            errors.append(f"{handle.__name__}.{name}{inspect.signature(actual)} != "
                          f"EngineHandle.{name}{inspect.signature(expected)}")
        # the protocol's generate is a plain def returning AsyncIterator: an async generator implements it
        expected_kind = "async iterator" if name == "generate" else _call_kind(expected)
        if _call_kind(actual) != expected_kind:
            errors.append(f"{handle.__name__}.{name} is {_call_kind(actual)}, EngineHandle's is {expected_kind}")
    missing = set(_protocol_attributes()) - _instance_attributes(handle)
    errors.extend(f"{handle.__name__}.{name} is never set" for name in sorted(missing))
    return errors


@pytest.mark.parametrize("handle", HANDLES, ids=lambda h: h.__name__)
def test_handle_conforms_to_the_engine_handle_contract(handle):
    assert conformance_errors(handle) == []


def test_a_drifted_signature_is_caught():
    """The drift found at 32ca785: ReplicaEngine.precompute_documents took no contexts (a TypeError under
    --replicas when the collections API passed them)."""

    class Drifted(AsyncEngine):
        async def precompute_documents(self, token_id_lists: list[list[int]], cache_salt: str | None = None) -> int:
            return 0

    errors = conformance_errors(Drifted)
    assert len(errors) == 1 and errors[0].startswith("Drifted.precompute_documents(")


def test_replica_module_imports_without_ray():
    assert "ray" not in sys.modules  # this test file imported replicas.replica_engine above


class _PrecomputeHandle:
    """Ray Serve's DeploymentHandle as ReplicaEngine uses it for precompute: options(...).precompute.remote(work)."""

    def __init__(self):
        self.works: list[PrecomputeWork] = []
        self.precompute = self

    def options(self, stream: bool):
        return self

    def remote(self, work: PrecomputeWork):
        self.works.append(work)

        async def reply():
            return sum(len(ids) for ids in work.token_id_lists), None
        return reply()


def test_replica_precompute_sends_each_replica_the_contexts():
    handle = _PrecomputeHandle()
    routing = RoutingState(PrefixRoutingPolicy())
    report = {"engine_stats": dataclasses.asdict(EngineStats(*([0] * 10)))}  # what each live replica reports
    routing.sync_replicas({"replica-a": report, "replica-b": report})
    facts = EngineFacts(49152, frozenset({2}), 2048, 2048, "cpu", "cpu", 16)
    engine = ReplicaEngine(handle, facts, routing)
    documents, contexts = [[5, 6, 7], [8, 9]], [[1, 2], [1, 3]]
    computed = asyncio.run(engine.precompute_documents(documents, "salt", contexts))
    assert computed == 2 * 5
    assert sorted(work.replica_id for work in handle.works) == ["replica-a", "replica-b"]
    assert all(work.token_id_lists == documents and work.context_token_id_lists == contexts and
               work.cache_salt == "salt" for work in handle.works)

"""What travels to a replica (no Ray needed), and `serve --replicas` without Ray installed."""

import pickle
import sys

import pytest

from engine.errors import RequestError
from engine.sampling_params import SamplingParams
from replicas.work import PrecomputeWork, ReplicaWork, split_grammars
from server.cli import main


def test_work_pickles_without_the_ingress_routing_state():
    work = ReplicaWork("r-1", [1, 2, 3], SamplingParams(max_tokens=4), "salt", (), [b"h" * 16], "session",
                       routing=object())
    copy = pickle.loads(pickle.dumps(work))
    assert copy.routing is None
    assert (copy.prompt_token_ids, copy.cache_salt, copy.page_hashes, copy.affinity_key) == (
        [1, 2, 3], "salt", [b"h" * 16], "session")


def test_precompute_work_pickles_without_the_ingress_routing_state():
    work = PrecomputeWork("replica-a", [[1, 2, 3], [4, 5]], "salt", routing=object())
    copy = pickle.loads(pickle.dumps(work))
    assert copy.routing is None and (copy.replica_id, copy.token_id_lists, copy.cache_salt) == (
        "replica-a", [[1, 2, 3], [4, 5]], "salt")


def test_only_grammar_processors_can_travel():
    params = SamplingParams(max_tokens=4, logits_processors=(lambda ids, logits: logits,))
    with pytest.raises(RequestError):
        split_grammars(params)
    assert split_grammars(SamplingParams(max_tokens=4)) == (SamplingParams(max_tokens=4), ())


def test_serve_replicas_without_ray_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    assert main(["serve", "--replicas", "2"]) == 1
    assert "make install-cluster" in capsys.readouterr().err

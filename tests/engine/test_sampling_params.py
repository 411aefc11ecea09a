import math

import pytest

from engine.errors import RequestError
from engine.sampling_params import SamplingParams


def test_defaults_are_valid_and_not_greedy():
    params = SamplingParams()
    assert not params.is_greedy
    assert not params.has_penalties
    assert not (params.has_top_k or params.has_top_p or params.has_min_p)


@pytest.mark.parametrize("temperature, is_greedy", [(0, True), (0.0, True), (1e-6, True),
                                                    (0.01, False), (2.0, False)])
def test_is_greedy(temperature, is_greedy):
    assert SamplingParams(temperature=temperature).is_greedy is is_greedy


@pytest.mark.parametrize("field, value", [
    ("max_tokens", 0), ("max_tokens", -3), ("max_tokens", 1.5), ("max_tokens", True),
    ("temperature", -0.1), ("temperature", 2.01), ("temperature", math.nan),
    ("temperature", "1"),
    ("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.01), ("top_p", math.inf),
    ("top_k", -2), ("top_k", 2.0),
    ("min_p", -0.01), ("min_p", 1.5),
    ("presence_penalty", -2.1), ("presence_penalty", 2.5),
    ("frequency_penalty", -3), ("frequency_penalty", 2.01),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", math.inf),
    ("logit_bias", {5: 101}), ("logit_bias", {5: -100.5}), ("logit_bias", {-1: 1.0}),
    ("logit_bias", {"x": 1.0}), ("logit_bias", {5: math.nan}), ("logit_bias", [1, 2]),
    ("seed", 1.5), ("seed", 2**64), ("seed", "7"),
    ("stop_token_ids", (1, -1)), ("stop_token_ids", (1.0,)),
    ("ignore_eos", 1),
    ("logprobs", -1), ("logprobs", 21), ("logprobs", 2.0),
    ("logits_processors", (42,)),
])
def test_out_of_range_values_raise_request_error_naming_the_field(field, value):
    with pytest.raises(RequestError, match=field.replace("_", "_")):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("field, value", [
    ("max_tokens", 1), ("temperature", 0), ("temperature", 2), ("top_p", 1e-9), ("top_p", 1),
    ("top_k", -1), ("top_k", 0), ("top_k", 1), ("min_p", 0), ("min_p", 1),
    ("presence_penalty", -2), ("presence_penalty", 2), ("frequency_penalty", 2),
    ("repetition_penalty", 0.01), ("repetition_penalty", 10),
    ("logit_bias", {0: -100, 7: 100.0}), ("seed", -(2**63)), ("seed", 2**64 - 1),
    ("logprobs", 0), ("logprobs", 20),
])
def test_boundary_values_are_accepted(field, value):
    SamplingParams(**{field: value})


def test_message_names_the_allowed_range():
    with pytest.raises(RequestError, match=r"temperature must be a number in \[0, 2\]"):
        SamplingParams(temperature=3)
    with pytest.raises(RequestError, match=r"top_p must be a number in \(0, 1\]"):
        SamplingParams(top_p=0)


def test_logit_bias_is_frozen_and_accepts_json_string_keys():
    source = {"12": 5, 3: -100}
    params = SamplingParams(logit_bias=source)
    assert dict(params.logit_bias) == {12: 5.0, 3: -100.0}
    source[99] = 1.0
    assert 99 not in params.logit_bias
    with pytest.raises(TypeError):
        params.logit_bias[4] = 1.0
    assert SamplingParams(logit_bias={}).logit_bias is None


def test_sequences_become_tuples():
    params = SamplingParams(stop_token_ids=[2, 3], logits_processors=[lambda ids, x: x])
    assert params.stop_token_ids == (2, 3)
    assert isinstance(params.logits_processors, tuple)


def test_check_vocab_size():
    SamplingParams(logit_bias={9: 1.0}, stop_token_ids=(9,)).check_vocab_size(10)
    with pytest.raises(RequestError, match="logit_bias names token id 10"):
        SamplingParams(logit_bias={10: 1.0}).check_vocab_size(10)
    with pytest.raises(RequestError, match="stop_token_ids names token id 12"):
        SamplingParams(stop_token_ids=(12,)).check_vocab_size(10)


def test_is_frozen():
    params = SamplingParams()
    with pytest.raises(AttributeError):
        params.temperature = 0.5

"""Defaults for what a request leaves out: a request's own values win, then a flag given, then the
model's generation_config.json (a GGUF's general.sampling.* keys land there), then the built-in
defaults; /v1/models and /health show them, the startup log says where each came from.

API tests run the app in-process with the fake engine, which records the SamplingParams it gets,
through the official clients."""

import json
import logging

import openai
import pytest

from server import cli
from server.generation_defaults import (BUILTIN_GENERATION_DEFAULTS, GenerationDefaults, model_generation_defaults,
                                        resolve_generation_defaults)
from server.serve_command import settings_from_args
from store.errors import RadixserveError
from store.gguf_import import convert_gguf

from tests.server.conftest import MODEL

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
HI = [{"role": "user", "content": "Hi"}]


def _sampled(params) -> dict:
    return {name: getattr(params, name) for name in (*SAMPLING, "max_tokens")}


def _model_dir_with(tmp_path, smollm2_dir, generation_config: dict):
    """The default model's files, with `generation_config` as its generation_config.json."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for path in smollm2_dir.iterdir():
        if path.name != "generation_config.json":
            (model_dir / path.name).symlink_to(path)
    (model_dir / "generation_config.json").write_text(json.dumps(generation_config))
    return model_dir


def _openai(client) -> openai.OpenAI:
    return openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key="unused", http_client=client, max_retries=0)


# ---- where each default comes from -----------------------------------------------------------


def test_without_flags_or_model_values_the_builtin_defaults_apply(smollm2_dir):
    resolved = resolve_generation_defaults(GenerationDefaults(), smollm2_dir)
    assert resolved.values == BUILTIN_GENERATION_DEFAULTS
    assert set(resolved.sources.values()) == {"default"}
    assert "temperature 0.8 (default)" in resolved.describe()


def test_the_models_generation_config_comes_before_the_builtin_and_a_flag_given_before_it(tmp_path, smollm2_dir):
    model_dir = _model_dir_with(tmp_path, smollm2_dir, {"eos_token_id": 2, "temperature": 0.6, "top_k": 20,
                                                         "max_new_tokens": 256, "max_length": 20, "do_sample": True})
    resolved = resolve_generation_defaults(GenerationDefaults(temperature=0.3), model_dir)
    assert (resolved.values.temperature, resolved.sources["temperature"]) == (0.3, "flag")
    assert (resolved.values.top_k, resolved.sources["top_k"]) == (20, "model")
    assert (resolved.values.max_tokens, resolved.sources["max_tokens"]) == (256, "model")  # max_length is ignored
    assert (resolved.values.top_p, resolved.sources["top_p"]) == (BUILTIN_GENERATION_DEFAULTS.top_p, "default")


@pytest.mark.parametrize("config, fragment", [
    ({"top_p": 0}, "top_p must be a number in (0, 1]"),
    ({"temperature": "hot"}, "temperature"),
    ({"max_new_tokens": 0}, "max_tokens must be an integer >= 1"),
])
def test_a_bad_value_in_generation_config_names_the_file(tmp_path, smollm2_dir, config, fragment):
    model_dir = _model_dir_with(tmp_path, smollm2_dir, config)
    with pytest.raises(ValueError, match="generation_config.json") as raised:
        model_generation_defaults(model_dir)
    assert fragment in str(raised.value)


def test_gguf_sampling_keys_are_written_into_generation_config(tmp_path, tiny_gguf, monkeypatch):
    import gguf

    class WriterWithSampling(gguf.GGUFWriter):  # what llama.cpp's convert_hf_to_gguf.py writes from a model
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_float32("general.sampling.temp", 0.6)
            self.add_int32("general.sampling.top_k", 20)
            self.add_float32("general.sampling.top_p", 0.9)
            self.add_float32("general.sampling.min_p", 0.1)
            self.add_float32("general.sampling.penalty_repeat", 1.1)

    monkeypatch.setattr(gguf, "GGUFWriter", WriterWithSampling)
    tiny_gguf(tmp_path / "tiny.gguf")
    model_dir = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert {key: generation[key] for key in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")} == \
        {"temperature": 0.6, "top_k": 20, "top_p": 0.9, "min_p": 0.1, "repetition_penalty": 1.1}
    assert model_generation_defaults(model_dir) == GenerationDefaults(0.6, 0.9, 20, 0.1, 1.1)


def test_flags_reach_the_settings_and_a_bad_one_is_one_line_naming_it(smollm2_dir):
    def args(*argv):
        return cli._build_parser().parse_args(["serve", *argv])

    assert settings_from_args(args(), smollm2_dir).generation_defaults == GenerationDefaults()
    settings = settings_from_args(args("--temperature", "0.5", "--top-p", "0.9", "--top-k", "10", "--min-p", "0.1",
                                       "--repetition-penalty", "1.2", "--presence-penalty", "0.4",
                                       "--frequency-penalty", "0", "--max-tokens", "300"), smollm2_dir)
    assert settings.generation_defaults == GenerationDefaults(temperature=0.5, top_p=0.9, top_k=10, min_p=0.1,
                                                              repetition_penalty=1.2, presence_penalty=0.4,
                                                              frequency_penalty=0.0, max_tokens=300)
    for argv, flag in ((("--top-p", "0"), "--top-p"), (("--max-tokens", "0"), "--max-tokens"),
                       (("--frequency-penalty", "2.5"), "--frequency-penalty"),
                       (("--temperature", "3"), "--temperature")):
        with pytest.raises(RadixserveError, match=f"^{flag}: "):
            settings_from_args(args(*argv), smollm2_dir)


# ---- through the APIs --------------------------------------------------------------------------


def test_each_api_without_sampling_fields_gets_the_defaults_and_a_requests_own_values_win(make_client):
    client, engine = make_client()
    api = _openai(client)
    defaults = {**BUILTIN_GENERATION_DEFAULTS.sampling_fields(), "max_tokens": BUILTIN_GENERATION_DEFAULTS.max_tokens}

    api.chat.completions.create(model=MODEL, messages=HI)
    assert _sampled(engine.params[-1]) == defaults
    api.chat.completions.create(model=MODEL, messages=HI, temperature=0.1, top_p=0.5, max_tokens=7,
                                presence_penalty=-0.5, frequency_penalty=0,
                                extra_body={"top_k": 3, "min_p": 0.2, "repetition_penalty": 1.3})
    assert _sampled(engine.params[-1]) == {"temperature": 0.1, "top_p": 0.5, "top_k": 3, "min_p": 0.2,
                                           "repetition_penalty": 1.3, "presence_penalty": -0.5,
                                           "frequency_penalty": 0, "max_tokens": 7}
    api.chat.completions.create(model=MODEL, messages=HI, max_completion_tokens=9, temperature=0)
    assert (engine.params[-1].max_tokens, engine.params[-1].temperature, engine.params[-1].top_k) == (9, 0, 40)

    api.completions.create(model=MODEL, prompt="Once upon a time")  # the server's cap, not OpenAI's 16
    assert _sampled(engine.params[-1]) == defaults
    api.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=1.5, top_p=0.7)
    assert _sampled(engine.params[-1]) == {**defaults, "max_tokens": 5, "temperature": 1.5, "top_p": 0.7}

    api.responses.create(model=MODEL, input="Hi", store=False)
    assert _sampled(engine.params[-1]) == defaults
    api.responses.create(model=MODEL, input="Hi", store=False, temperature=0.2, top_p=0.6, max_output_tokens=11)
    assert _sampled(engine.params[-1]) == {**defaults, "temperature": 0.2, "top_p": 0.6, "max_tokens": 11}

    # Anthropic's SDK takes no in-process client (it is on httpx2): its request body, as it sends it.
    def create_message(**fields):
        response = client.post("/v1/messages", json={"model": MODEL, "messages": HI, "max_tokens": 12, **fields})
        assert response.status_code == 200, response.text

    create_message()  # max_tokens: required by Anthropic's API
    assert _sampled(engine.params[-1]) == {**defaults, "max_tokens": 12}
    create_message(temperature=0.3, top_p=0.4, top_k=5)
    assert _sampled(engine.params[-1]) == {**defaults, "max_tokens": 12, "temperature": 0.3, "top_p": 0.4, "top_k": 5}


def test_models_and_health_show_the_defaults_in_force_and_their_sources(make_client, tmp_path, smollm2_dir, caplog):
    model_dir = _model_dir_with(tmp_path, smollm2_dir, {"eos_token_id": 2, "top_k": 20})
    from engine.engine_config import EngineConfig

    with caplog.at_level(logging.INFO, logger="radixserve.server"):
        client, engine = make_client(engine=EngineConfig(model_dir=model_dir),
                                     generation_defaults=GenerationDefaults(temperature=0.3, max_tokens=100_000))
    assert any("defaults for what a request leaves out: temperature 0.3 (flag), top_p 0.95 (default), "
               "top_k 20 (model)" in record.getMessage() for record in caplog.records)
    expected = {"temperature": 0.3, "top_p": 0.95, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.0,
                "presence_penalty": BUILTIN_GENERATION_DEFAULTS.presence_penalty,
                "frequency_penalty": BUILTIN_GENERATION_DEFAULTS.frequency_penalty, "max_tokens": 100_000}
    sources = {"temperature": "flag", "top_p": "default", "top_k": "model", "min_p": "default",
               "repetition_penalty": "default", "presence_penalty": "default", "frequency_penalty": "default",
               "max_tokens": "flag"}
    api = _openai(client)
    card = api.models.retrieve(MODEL)
    assert card.model_extra["generation_defaults"] == expected
    assert card.model_extra["generation_defaults_sources"] == sources
    assert api.models.list().data[0].model_extra["generation_defaults"] == expected
    health = client.get("/health").json()
    assert (health["generation_defaults"], health["generation_defaults_sources"]) == (expected, sources)
    api.chat.completions.create(model=MODEL, messages=HI)  # the default cap, cut to what the context has left
    num_tokens_left = engine.facts.max_num_request_tokens - len(engine.prompts[-1])
    assert _sampled(engine.params[-1]) == {**expected, "max_tokens": num_tokens_left}


def test_a_greedy_request_takes_no_default_penalty_but_keeps_its_own():
    from server.sampling import with_defaults
    defaults = BUILTIN_GENERATION_DEFAULTS
    assert defaults.presence_penalty > 0  # the built-in default this guards
    sampled = with_defaults({}, None, defaults, num_tokens_left=4096)
    assert sampled.presence_penalty == defaults.presence_penalty
    greedy = with_defaults({"temperature": 0.0}, None, defaults, num_tokens_left=4096)
    assert greedy.presence_penalty == 0 and greedy.frequency_penalty == 0 and greedy.repetition_penalty == 1
    own = with_defaults({"temperature": 0.0, "presence_penalty": 0.5}, 8, defaults, num_tokens_left=4096)
    assert own.presence_penalty == 0.5 and own.max_tokens == 8

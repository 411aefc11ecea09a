"""Defaults for the sampling fields a request leaves out, and where each came from.

A field a request sets always wins. For one it leaves out, the value is, first found:
the server flag when the operator gave it (`serve --temperature ...`), the model's
`generation_config.json` (HF keys, as vLLM reads them; a GGUF file's `general.sampling.*`
keys are written there at conversion, store/gguf_import.py), else this file's
`BUILTIN_GENERATION_DEFAULTS`, chosen by measurement on the default model
(bench/defaults_bench.py, docs/performance.md).

`GenerationDefaults` is one frozen dataclass whose fields are the flags: a field None is
"not set at this level". Each field is a `setting` (engine/setting.py) naming its flag and help
text, so the command line is derived from it (server/config_flags.py). This module imports nothing
heavy: `--help` must not import torch.
"""

import argparse
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from engine.errors import RequestError
from engine.sampling_params import SamplingParams
from engine.setting import setting
from server.config_flags import add_config_flags, config_from_args

GENERATION_CONFIG_FILE = "generation_config.json"

# A field's source, as the startup log, /health and /v1/models say it.
SOURCE_FLAG = "flag"  # given on the command line
SOURCE_MODEL = "model"  # the model's generation_config.json
SOURCE_BUILTIN = "default"  # the flag's default (BUILTIN_GENERATION_DEFAULTS)

# generation_config.json key -> field (vLLM reads the same keys; max_length, do_sample and the rest are ignored:
# max_length counts the prompt, and do_sample is transformers' switch, not a sampling value)
_HF_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
            "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def _flag(name: str, help_text: str):
    """A field None by default (not set here), its help ending with the built-in default."""
    field_name = name.removeprefix("--").replace("-", "_")
    return setting(None, help_text, flag=name, metavar="N" if field_name in ("top_k", "max_tokens") else "X",
                   show=lambda _: f"{getattr(BUILTIN_GENERATION_DEFAULTS, field_name):g}")


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling values for what a request leaves out; None: not set at this level."""

    temperature: float | None = _flag(
        "--temperature", "randomness of sampling, 0 for greedy (0 to 2)")
    top_p: float | None = _flag(
        "--top-p", "sample from the smallest set of tokens whose probabilities add up to P (0 < P <= 1; 1: off)")
    top_k: int | None = _flag(
        "--top-k", "sample from the K most likely tokens (-1 or 0: off)")
    min_p: float | None = _flag(
        "--min-p", "drop tokens less likely than P times the most likely one (0 to 1; 0: off)")
    repetition_penalty: float | None = _flag(
        "--repetition-penalty", "divide the logits of tokens already in prompt or output by this (> 0; 1: off)")
    presence_penalty: float | None = _flag(
        "--presence-penalty", "subtract this from the logit of each token already generated (-2 to 2; 0: off)")
    frequency_penalty: float | None = _flag(
        "--frequency-penalty", "subtract this times its count from the logit of each token already generated "
                               "(-2 to 2; 0: off)")
    max_tokens: int | None = _flag(
        "--max-tokens", "new tokens at most when a request does not say (cut to what the context has left)")

    def __post_init__(self):
        """ValueError naming the field for a value no request could have either."""
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        try:
            SamplingParams(**self.sampling_fields())
        except RequestError as error:
            raise ValueError(str(error)) from None

    def sampling_fields(self) -> dict[str, Any]:
        """The SamplingParams fields set here, max_tokens aside."""
        return {name: value for name, value in self.as_dict().items() if value is not None and name != "max_tokens"}

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def over(self, fallback: "GenerationDefaults") -> "GenerationDefaults":
        """Each field from here where set, else from `fallback`."""
        return GenerationDefaults(**{name: value if value is not None else getattr(fallback, name)
                                     for name, value in self.as_dict().items()})


# The flags' defaults (docs/performance.md): llama.cpp's server's sampling, with a presence penalty of 1 against
# the loops that ran about 1 everyday answer in 10 of the default model to the cap (with it, every measured answer
# ended by itself); and a cap of 1024 new tokens, so a runaway never runs to the context
BUILTIN_GENERATION_DEFAULTS = GenerationDefaults(temperature=0.8, top_p=0.95, top_k=40, min_p=0.05,
                                                 repetition_penalty=1.0, presence_penalty=1.0, frequency_penalty=0.0,
                                                 max_tokens=1024)


@dataclass(frozen=True)
class ResolvedGenerationDefaults:
    """The defaults in force (every field set) and where each came from (SOURCE_*)."""

    values: GenerationDefaults
    sources: dict[str, str]

    def describe(self) -> str:
        """One line for the startup log: `temperature 0.8 (default), top_p 0.95 (model), ...`."""
        return ", ".join(f"{name} {value:g} ({self.sources[name]})" for name, value in self.values.as_dict().items())

    def as_json(self) -> dict[str, Any]:
        """What /health and /v1/models show: each field's value and source."""
        return {name: {"value": value, "source": self.sources[name]} for name, value in self.values.as_dict().items()}


def resolve_generation_defaults(flags: GenerationDefaults, model_dir: Path) -> ResolvedGenerationDefaults:
    """Flags given > the model's generation_config.json > BUILTIN_GENERATION_DEFAULTS, field by field.
    Raises ValueError naming the file for a value there that is not a valid default."""
    from_model = model_generation_defaults(model_dir)
    values = flags.over(from_model).over(BUILTIN_GENERATION_DEFAULTS)
    sources = {name: SOURCE_FLAG if getattr(flags, name) is not None
               else SOURCE_MODEL if getattr(from_model, name) is not None else SOURCE_BUILTIN
               for name in values.as_dict()}
    return ResolvedGenerationDefaults(values, sources)


def model_generation_defaults(model_dir: Path) -> GenerationDefaults:
    """The sampling values `model_dir/generation_config.json` sets (none when it has no such file)."""
    path = Path(model_dir) / GENERATION_CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return GenerationDefaults()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read it: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    values = {name: config[key] for key, name in _HF_KEYS.items() if config.get(key) is not None}
    if isinstance(values.get("top_k"), float) and values["top_k"].is_integer():
        values["top_k"] = int(values["top_k"])
    if isinstance(values.get("max_tokens"), float) and values["max_tokens"].is_integer():
        values["max_tokens"] = int(values["max_tokens"])
    try:
        return GenerationDefaults(**values)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{path}: {error}") from None


def add_generation_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per GenerationDefaults field, default None (not given: the model's value, else the built-in)."""
    group = parser.add_argument_group(
        "defaults for what a request leaves out",
        "a request's own value wins; else the flag when given, else the model's generation_config.json, "
        "else the default shown")
    add_config_flags(group, GenerationDefaults)


def generation_flags_from_args(args: argparse.Namespace) -> GenerationDefaults:
    """The flags given (ValueError naming the flag for a bad value)."""
    return config_from_args(GenerationDefaults, args)

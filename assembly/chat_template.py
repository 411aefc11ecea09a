"""HF-compatible chat templates, rendered in a sandbox.

Rendered the way transformers renders them: an immutable sandboxed Jinja
environment with trim_blocks, lstrip_blocks and loop controls, `tojson` without
HTML escaping, `raise_exception` and `strftime_now`. A template cannot reach
Python internals: the sandbox refuses attribute access to them.
"""

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(ValueError):
    """A template that raises, or that a request's messages break."""


def _raise_exception(message: str):
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent=None, separators=None, sort_keys=False) -> str:
    # As transformers: no HTML escaping (jinja's own tojson escapes <, >, &, ').
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# Names the renderer sets itself; `chat_template_kwargs` may not override them.
RESERVED_NAMES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


def compile_template(source: str, what: str = "chat template") -> jinja2.Template:
    """`source` compiled in the sandboxed environment; TemplateError for a syntax error."""
    try:
        return _make_environment().from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise TemplateError(f"{what} syntax error at line {error.lineno}: {error.message}") from None


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str] | None = None):
        self.source = source
        # bos_token, eos_token, ... as transformers passes them to the template.
        self.special_tokens = dict(special_tokens or {})
        self._template = compile_template(source)
        variables = meta.find_undeclared_variables(_make_environment().parse(source))
        # Whether the template renders these itself; when not, the prompt builder adds built-in blocks.
        self.supports_tools = "tools" in variables
        self.supports_documents = "documents" in variables

    def render(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """`template_kwargs`: more variables (a request's chat_template_kwargs)."""
        template_kwargs = template_kwargs or {}
        reserved = RESERVED_NAMES & template_kwargs.keys()
        if reserved:
            raise TemplateError(f"chat_template_kwargs may not set {sorted(reserved)}")
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **template_kwargs},
            )
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as error:
            raise TemplateError(f"chat template tried an unsafe operation: {error}") from None
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as error:
            raise TemplateError(f"chat template failed on these messages: {error}") from None

    @classmethod
    def from_model_dir(cls, model_dir: Path, template_path: Path | None = None) -> "ChatTemplate":
        """The template of `template_path` when given (`--chat-template`), else the model's:
        `chat_template.jinja`, else `tokenizer_config.json`'s."""
        model_dir = Path(model_dir)
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        jinja_path = Path(template_path) if template_path is not None else model_dir / "chat_template.jinja"
        if template_path is not None and not jinja_path.is_file():
            raise TemplateError(f"{jinja_path}: no such chat template file")
        source = jinja_path.read_text() if jinja_path.is_file() else config.get("chat_template")
        if isinstance(source, list):  # HF's list of named templates
            source = next((t["template"] for t in source if t.get("name") == "default"), None)
        if not source:
            raise TemplateError(f"{model_dir}: the model has no chat template")
        special_tokens = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = config.get(name)
            if isinstance(value, dict):  # AddedToken serialisation
                value = value.get("content")
            if isinstance(value, str):
                special_tokens[name] = value
        return cls(source, special_tokens)

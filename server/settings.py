"""The HTTP server's settings, validated once; the one place its environment variables are read."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.pin_config import PinConfig
from server.generation_defaults import GenerationDefaults

if TYPE_CHECKING:  # torch: the command line reads this file's defaults before anything loads a model
    from engine.engine_config import EngineConfig

API_KEY_ENV_VAR = "RADIXSERVE_API_KEY"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_WAITING = 256  # queued requests before new ones get 503
DEFAULT_MAX_BODY_BYTES = 8 << 20
MAX_CHOICES = 16  # the largest `n` a request may ask for
DEFAULT_RESPONSES_MAX_COUNT = 10_000  # stored Responses, oldest out first
DEFAULT_RESPONSES_MAX_BYTES = 256 << 20
DEFAULT_RESPONSES_MAX_AGE_SECONDS = 30 * 86400.0  # as OpenAI: stored responses live 30 days
DEFAULT_MAX_SCHEMA_BYTES = 256 << 10  # JSON of the schemas one request's grammar is compiled from
DEFAULT_RECEIVE_TIMEOUT_SECONDS = 30.0  # to send a whole request (headers and body), else the connection closes


def default_collections_dir() -> Path:
    """`$RADIXSERVE_HOME/collections`."""
    from store.model_store import radixserve_home

    return radixserve_home() / "collections"


def default_responses_db() -> Path:
    """`$RADIXSERVE_HOME/responses.sqlite3`."""
    from store.model_store import radixserve_home

    return radixserve_home() / "responses.sqlite3"


def read_api_keys_file(path: Path) -> list[str]:
    """One key a line; blank lines and lines starting with # are skipped."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def api_key_from_environment() -> str | None:
    """`$RADIXSERVE_API_KEY`, or None when unset or empty."""
    return os.environ.get(API_KEY_ENV_VAR) or None


@dataclass(frozen=True)
class ServerSettings:
    engine: EngineConfig
    served_model_name: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None  # when set, /v1 routes need `Authorization: Bearer <key>` (or `x-api-key`)
    more_api_keys: tuple[str, ...] = ()  # further accepted keys (`--api-key` repeated, `--api-keys-file`)
    tenant_per_key: bool = False  # each key gets its own cache salt unless a request names one
    max_waiting: int = DEFAULT_MAX_WAITING  # engine.stats().num_waiting at which requests get 503
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES  # tools' parameters + response_format schema, as JSON
    receive_timeout_seconds: float = DEFAULT_RECEIVE_TIMEOUT_SECONDS  # server/connection_deadline.py
    collections_dir: Path = field(default_factory=default_collections_dir)  # retrieval collections live here
    chat_template_path: Path | None = None  # overrides the model's template
    pins: PinConfig = PinConfig()  # how long tool-call turns and cache breakpoints keep their prefix (engine/pin_config.py)
    responses_db: Path = field(default_factory=default_responses_db)  # stored Responses (SQLite)
    responses_max_count: int = DEFAULT_RESPONSES_MAX_COUNT
    responses_max_bytes: int = DEFAULT_RESPONSES_MAX_BYTES
    responses_max_age_seconds: float = DEFAULT_RESPONSES_MAX_AGE_SECONDS
    rag_order: str = "relevance"  # retrieved documents in the prompt: "relevance" or "canonical" (server/rag_context.py)
    allowed_origins: tuple[str, ...] = ()  # CORS: browser origins that may call the API ("*": any); () no CORS
    # Sampling defaults the operator set (serve --temperature ...); a field None: the model's, else the built-in
    # (server/generation_defaults.py)
    generation_defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    ui: bool = True  # the web console at / (server/routes_console.py)

    def __post_init__(self):
        if not self.served_model_name:
            raise ValueError("served model name must not be empty")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_waiting < 1:
            raise ValueError(f"max waiting must be >= 1, got {self.max_waiting}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max body bytes must be >= 1024, got {self.max_body_bytes}")
        if self.max_schema_bytes < 1024:
            raise ValueError(f"max schema bytes must be >= 1024, got {self.max_schema_bytes}")
        if not 0 < self.receive_timeout_seconds <= 3600:
            raise ValueError(f"receive timeout must be in (0, 3600] seconds, got {self.receive_timeout_seconds}")
        if self.rag_order not in ("relevance", "canonical"):
            raise ValueError(f"rag order must be relevance or canonical, got {self.rag_order!r}")
        for origin in self.allowed_origins:
            if origin != "*" and not (origin.startswith(("http://", "https://")) and origin.count("/") == 2):
                raise ValueError(f"allowed origin must be '*' or scheme://host[:port] (no path), got {origin!r}")
        if any(key is not None and not key.strip() for key in (self.api_key, *self.more_api_keys)):
            raise ValueError("api key must not be blank")
        if self.more_api_keys and self.api_key is None:
            raise ValueError("more api keys need a first api key")
        if self.tenant_per_key and self.api_key is None:
            raise ValueError("tenant per key needs api keys")
        if self.responses_max_count < 1 or self.responses_max_bytes < 1 or self.responses_max_age_seconds <= 0:
            raise ValueError("responses store bounds (count, bytes, age) must be positive")

    @property
    def api_keys(self) -> tuple[str, ...]:
        """Every accepted key; empty: the routes are open."""
        return () if self.api_key is None else (self.api_key, *self.more_api_keys)

"""The HTTP server's settings, validated once; the one place its environment variables are read."""

import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.engine_config import EngineConfig

API_KEY_ENV_VAR = "RADIXSERVE_API_KEY"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_WAITING = 256  # queued requests before new ones get 503
DEFAULT_MAX_BODY_BYTES = 8 << 20
MAX_CHOICES = 16  # the largest `n` a request may ask for
DEFAULT_TOOL_PIN_SECONDS = 30.0  # a tool-call turn's cached prefix outlives eviction this long
DEFAULT_MAX_SCHEMA_BYTES = 256 << 10  # JSON of the schemas one request's grammar is compiled from
DEFAULT_RECEIVE_TIMEOUT_SECONDS = 30.0  # to send a whole request (headers and body), else the connection closes


def default_collections_dir() -> Path:
    """`$RADIXSERVE_HOME/collections`."""
    from engine.model_store import radixserve_home

    return radixserve_home() / "collections"


def api_key_from_environment() -> str | None:
    """`$RADIXSERVE_API_KEY`, or None when unset or empty."""
    return os.environ.get(API_KEY_ENV_VAR) or None


@dataclass(frozen=True)
class ServerSettings:
    engine: EngineConfig
    served_model_name: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None  # when set, /v1 routes need `Authorization: Bearer <key>`
    max_waiting: int = DEFAULT_MAX_WAITING  # engine.stats().num_waiting at which requests get 503
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES  # tools' parameters + response_format schema, as JSON
    receive_timeout_seconds: float = DEFAULT_RECEIVE_TIMEOUT_SECONDS  # server/connection_deadline.py
    collections_dir: Path = field(default_factory=default_collections_dir)  # retrieval collections live here
    tool_pin_seconds: float = DEFAULT_TOOL_PIN_SECONDS  # 0: no pinning
    chat_template_path: Path | None = None  # overrides the model's template
    rag_order: str = "relevance"  # retrieved documents in the prompt: "relevance" or "canonical" (server/rag_context.py)

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
        if not 0 <= self.tool_pin_seconds <= 3600:
            raise ValueError(f"tool pin seconds must be in [0, 3600], got {self.tool_pin_seconds}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api key must not be blank")

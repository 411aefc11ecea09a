"""What a request asks of the engine beyond sampling: how its prompt may reuse KV, how it decodes.

None means "the engine's default" (its EngineConfig), so a client that says nothing gets what
the server was started with, and a client can only switch a capability off for itself.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestOptions:
    # Reuse stored document KV at any position (derived KV); False: exact KV only (prefix cache).
    document_reuse: bool | None = None
    # Prompt token ranges [start, end) that are documents (from `documents` / `retrieval`):
    # exact span boundaries; the engine also finds spans itself in the token stream.
    document_spans: tuple[tuple[int, int], ...] = ()
    # Draft-free speculative decoding for this request; False: one token a step.
    speculation: bool | None = None

    def __post_init__(self):
        for start, end in self.document_spans:
            if not 0 <= start < end:
                raise ValueError(f"a document span must be 0 <= start < end, got [{start}, {end})")


DEFAULT_REQUEST_OPTIONS = RequestOptions()

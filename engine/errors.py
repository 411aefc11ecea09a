"""Errors the engine raises for requests it cannot serve.

Each carries a one-line message meant for a user: the CLI prints it as
``radixserve: error: <message>`` and exits non-zero, the server turns it into
an OpenAI error object.
"""

from store.errors import RadixserveError


class RequestError(RadixserveError):
    """A request the engine cannot serve (too long, bad sampling values, ...)."""

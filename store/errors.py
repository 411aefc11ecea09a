"""Errors meant for a user: their base, and those of bad model files and failed pulls.

The base lives here, in the lowest package that raises such errors, so every
package above (model, engine, server) can subclass or catch it.

Each carries a one-line message meant for a user: the CLI prints it as
``radixserve: error: <message>`` and exits non-zero, the server turns it into
an OpenAI error object.
"""

from pathlib import Path


class RadixserveError(Exception):
    """Base of every error meant to be shown to a user as one line."""


class ModelFormatError(RadixserveError):
    """A model file or directory is missing, corrupt, or of an unsupported kind."""

    def __init__(self, path: str | Path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class PullError(RadixserveError):
    """Fetching or checking a model package failed."""

    def __init__(self, what: str, reason: str):
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")


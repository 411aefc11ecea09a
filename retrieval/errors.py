"""What retrieval raises for a caller's mistake (the server maps each to an HTTP status)."""


class RetrievalError(Exception):
    """Base of the errors below; the message is meant for the user."""


class InvalidInputError(RetrievalError, ValueError):
    """Bad names, empty texts, duplicate ids, a top_k out of range (400)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param  # the offending field, e.g. "name", "documents[2].text"


class CollectionNotFoundError(RetrievalError):
    """(404)"""


class CollectionExistsError(RetrievalError):
    """(409)"""


class DocumentNotFoundError(RetrievalError):
    """(404)"""


class EmbedderMismatchError(RetrievalError):
    """A collection's vectors came from another embedding model or dimension (409)."""

"""Real English text that needs no download: docstrings of Python standard library modules.

The module list is fixed and sorted, members are walked in sorted order, and only prose
paragraphs are kept (no doctests, no tables), so for a given Python version the corpus is
the same on every machine. Modules that fail to import (a stripped-down Python) are skipped.
"""

import functools
import importlib
import inspect
import re
import warnings

MODULES = (
    "abc", "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures",
    "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email",
    "enum", "fractions", "functools", "gettext", "gzip", "hashlib", "heapq", "hmac", "html.parser",
    "http.client", "http.server", "inspect", "io", "ipaddress", "itertools", "json", "logging", "mailbox",
    "math", "mimetypes", "operator", "optparse", "os", "pathlib", "pickle", "pprint", "queue", "random",
    "re", "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "smtplib", "socket", "statistics",
    "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize",
    "traceback", "typing", "unittest", "urllib.parse", "urllib.request", "uuid", "warnings", "weakref",
    "xml.dom.minidom", "zipfile",
)
MIN_PARAGRAPH_WORDS = 8
_PROSE_CHARS = re.compile(r"[A-Za-z ,.;:'()\-]")
MIN_PROSE_SHARE = 0.9  # of a paragraph's characters: drops code, tables and signatures
_WORD = re.compile(r"[A-Za-z]{3,}")


def _docstrings(module_name: str) -> list[str]:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return []
    docs = [inspect.getdoc(module) or ""]
    with warnings.catch_warnings():  # deprecated aliases (typing.io) warn when touched
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in sorted(vars(module)):
            member = getattr(module, name)
            if name.startswith("_") or getattr(member, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(member) or inspect.isfunction(member):
                docs.append(inspect.getdoc(member) or "")
    return docs


def _is_prose(paragraph: str) -> bool:
    if len(paragraph.split()) < MIN_PARAGRAPH_WORDS or paragraph.startswith(">>>"):
        return False
    return len(_PROSE_CHARS.findall(paragraph)) >= MIN_PROSE_SHARE * len(paragraph)


@functools.cache
def paragraphs() -> tuple[str, ...]:
    """Prose paragraphs, whitespace collapsed, duplicates dropped, in module order."""
    found: dict[str, None] = {}
    for module_name in MODULES:
        for doc in _docstrings(module_name):
            for raw in doc.split("\n\n"):
                paragraph = " ".join(raw.split())
                if _is_prose(paragraph):
                    found.setdefault(paragraph)
    return tuple(found)


@functools.cache
def words() -> tuple[str, ...]:
    """The corpus's distinct words of 3+ letters, sorted: the vocabulary of random prompts."""
    return tuple(sorted({w.lower() for p in paragraphs() for w in _WORD.findall(p)}))


def documents(num_documents: int, num_words: int) -> tuple[str, ...]:
    """`num_documents` passages of about `num_words` words each (whole paragraphs, consecutive).

    Raises ValueError when the corpus is too small for the request.
    """
    docs: list[str] = []
    current: list[str] = []
    num_current_words = 0
    for paragraph in paragraphs():
        current.append(paragraph)
        num_current_words += len(paragraph.split())
        if num_current_words >= num_words:
            docs.append("\n".join(current))
            current, num_current_words = [], 0
            if len(docs) == num_documents:
                return tuple(docs)
    raise ValueError(f"the corpus has only {len(docs)} passages of {num_words} words, {num_documents} asked")

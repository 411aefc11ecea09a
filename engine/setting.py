"""Settings that document themselves: a feature's frozen config dataclass declares each field with
`setting(...)`, and the command line derives its flag from it (server/config_flags.py: the flag name,
type, choices, help and default come from the field). Adding a flag is one field in the feature's file.

Pure Python (no torch): `radixserve --help` builds the flags without loading the engine.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

SAME_FOR_SERVE = object()  # SettingDoc.serve_default when `serve` keeps the dataclass's default


@dataclasses.dataclass(frozen=True)
class SettingDoc:
    help: str  # the flag's help text (the default is appended)
    flag: str | None = None  # the flag's name when it is not --<field-name-with-dashes>
    choices: tuple | None = None
    parse: Callable[[str], Any] | None = None  # text -> value; default: the field's type (int, float, str)
    metavar: str | None = None
    serve_default: Any = SAME_FOR_SERVE  # `serve`'s default where it differs from the dataclass's


def setting(default, help: str, *, flag: str | None = None, choices: tuple | None = None,
            parse: Callable[[str], Any] | None = None, metavar: str | None = None,
            serve_default: Any = SAME_FOR_SERVE) -> dataclasses.Field:
    """A config dataclass field with the documentation its flag is derived from."""
    doc = SettingDoc(help, flag, choices, parse, metavar, serve_default)
    return dataclasses.field(default=default, metadata={"setting": doc})


def setting_doc(field: dataclasses.Field) -> SettingDoc | None:
    return field.metadata.get("setting")

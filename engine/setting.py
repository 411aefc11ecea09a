"""Settings that document themselves: a feature's frozen config dataclass declares each field with
`setting(...)`, and the command line derives its flag from it (server/config_flags.py: the flag name,
type, choices, help and default come from the field). Adding a flag is one field in the feature's file.

Pure Python (no torch): `radixserve --help` builds the flags without loading the engine.
"""

import dataclasses
import re
from collections.abc import Callable
from typing import Any

SAME_FOR_SERVE = object()  # SettingDoc.serve_default when `serve` keeps the dataclass's default

SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


@dataclasses.dataclass(frozen=True)
class SettingDoc:
    help: str  # the flag's help text (the default is appended)
    flag: str | None = None  # the flag's name when it is not --<field-name-with-dashes>
    choices: tuple | None = None  # the flag's words (checked before `parse`)
    # text -> value, ValueError for a bad one (said as '<flag>: <message>'); default: the field's type
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    serve_default: Any = SAME_FOR_SERVE  # `serve`'s default where it differs from the dataclass's
    show: Callable[[Any], str] | None = None  # the default as the help says it (default: str)


def setting(default, help: str, *, flag: str | None = None, choices: tuple | None = None,
            parse: Callable[[str], Any] | None = None, metavar: str | None = None,
            serve_default: Any = SAME_FOR_SERVE, show: Callable[[Any], str] | None = None) -> dataclasses.Field:
    """A config dataclass field with the documentation its flag is derived from."""
    doc = SettingDoc(help, flag, choices, parse, metavar, serve_default, show)
    return dataclasses.field(default=default, metadata={"setting": doc})


def setting_doc(field: dataclasses.Field) -> SettingDoc | None:
    return field.metadata.get("setting")


def parse_size(text: str) -> int:
    """'2GiB', '500MB', '1073741824' -> bytes (> 0); ValueError for anything else."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip().lower())
    if match and match.group(2) in SIZE_UNITS and (match.group(2) or float(match.group(1)) >= 1):
        num_bytes = int(float(match.group(1)) * SIZE_UNITS[match.group(2)])
        if num_bytes > 0:
            return num_bytes
    raise ValueError(f"expected bytes like '1GiB' or '512MiB', got {text!r}")


def show_size(num_bytes: int) -> str:
    """4 << 30 -> '4GiB' (the largest binary unit that divides it)."""
    for unit in ("GiB", "MiB", "KiB"):
        if num_bytes % SIZE_UNITS[unit.lower()] == 0:
            return f"{num_bytes // SIZE_UNITS[unit.lower()]}{unit}"
    return str(num_bytes)


def parse_on_off(text: str) -> bool:
    return text == "on"


def show_on_off(value: bool) -> str:
    return "on" if value else "off"

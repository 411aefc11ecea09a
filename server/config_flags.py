"""Command-line flags derived from a feature's config dataclass (engine/setting.py's `setting` fields):
`add_config_flags` declares them, `config_from_args` builds the dataclass from the flags given."""

import argparse
import dataclasses
import types
import typing

from engine.setting import SAME_FOR_SERVE, setting_doc


def flag_name(field: dataclasses.Field) -> str:
    doc = setting_doc(field)
    return doc.flag or "--" + field.name.replace("_", "-")


def _value_type(field: dataclasses.Field):
    """int, float or str for argparse (`X | None` is X); anything else stays text for the field's `parse`."""
    value_type = field.type
    if isinstance(value_type, types.UnionType):
        value_type = next((arg for arg in typing.get_args(value_type) if arg is not type(None)), str)
    return value_type if value_type in (int, float, str) else str


def _dest(config_class: type, field: dataclasses.Field) -> str:
    return f"{config_class.__name__}.{field.name}"


def add_config_flags(parser, config_class: type, *, serving: bool = True) -> None:
    """One flag per `setting` field of `config_class` on `parser` (or an argument group); its help ends with the
    default (`serve`'s with `serving`). Flags given stay text where the field has its own `parse`: parsed by
    `config_from_args`, so a bad value is one line naming the flag."""
    for field in dataclasses.fields(config_class):
        doc = setting_doc(field)
        if doc is None:
            continue
        default = doc.serve_default if serving and doc.serve_default is not SAME_FOR_SERVE else field.default
        value_type = None if doc.parse else _value_type(field)
        metavar = doc.metavar or (None if doc.choices else field.name.upper())
        shown = doc.show(default) if doc.show else None if default is None else str(default)
        help_text = doc.help if shown is None else f"{doc.help} (default: {shown})"  # None: the help says
        parser.add_argument(flag_name(field), dest=_dest(config_class, field), type=value_type, choices=doc.choices,
                            metavar=metavar, default=None, help=help_text)


def config_from_args(config_class: type, args: argparse.Namespace, *, serving: bool = True, **given):
    """The config of the flags given, the others at their (serve) defaults; `given` fields are set by the
    caller. ValueError from parsing (naming the flag) or from the dataclass's validation."""
    values = {}
    for field in dataclasses.fields(config_class):
        doc = setting_doc(field)
        if doc is None:
            continue
        value = getattr(args, _dest(config_class, field), None)
        if value is not None and doc.parse is not None:
            try:
                value = doc.parse(value)
            except ValueError as error:
                raise ValueError(f"{flag_name(field)}: {error}") from None
        if value is None and serving and doc.serve_default is not SAME_FOR_SERVE:
            value = doc.serve_default
        if value is not None:
            values[field.name] = value
    try:
        return config_class(**values, **given)
    except ValueError as error:  # a message that starts with a field's name is said as its flag's
        named = next((field for field in dataclasses.fields(config_class) if setting_doc(field)
                      and str(error).startswith(field.name)), None)
        raise ValueError(f"{flag_name(named)}: {error}" if named else str(error)) from None

"""Command-line flags derived from a feature's config dataclass (engine/setting.py's `setting` fields):
`add_config_flags` declares them, `config_from_args` builds the dataclass from the flags given."""

import argparse
import dataclasses

from engine.setting import SAME_FOR_SERVE, setting_doc


def _flag(field: dataclasses.Field) -> str:
    doc = setting_doc(field)
    return doc.flag or "--" + field.name.replace("_", "-")


def _dest(config_class: type, field: dataclasses.Field) -> str:
    return f"{config_class.__name__}.{field.name}"


def add_config_flags(parser: argparse.ArgumentParser, config_class: type, *, serving: bool = True) -> None:
    """One flag per `setting` field of `config_class`; its help ends with the default (`serve`'s with `serving`)."""
    for field in dataclasses.fields(config_class):
        doc = setting_doc(field)
        if doc is None:
            continue
        default = doc.serve_default if serving and doc.serve_default is not SAME_FOR_SERVE else field.default
        parse = doc.parse or (field.type if field.type in (int, float, str) else str)
        metavar = doc.metavar or (None if doc.choices else field.name.upper())
        help_text = doc.help if default is None else f"{doc.help} (default: {default})"  # None: the help says
        parser.add_argument(_flag(field), dest=_dest(config_class, field), type=parse, choices=doc.choices,
                            metavar=metavar, default=None, help=help_text)


def config_from_args(config_class: type, args: argparse.Namespace, *, serving: bool = True):
    """The config of the flags given, the others at their (serve) defaults. ValueError from its validation."""
    values = {}
    for field in dataclasses.fields(config_class):
        doc = setting_doc(field)
        if doc is None:
            continue
        value = getattr(args, _dest(config_class, field), None)
        if value is None and serving and doc.serve_default is not SAME_FOR_SERVE:
            value = doc.serve_default
        if value is not None:
            values[field.name] = value
    return config_class(**values)

"""Typed settings: one frozen dataclass per process, every field with a
default and a one-line description.

Each field is settable by a command-line flag (``--field-name``) and by an
environment variable (``LLMMESH_FIELD_NAME``); a flag wins over the
environment, which wins over the default.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
from collections.abc import Mapping
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

ENV_PREFIX = "LLMMESH_"

S = TypeVar("S")


def setting(default: Any, help: str) -> Any:
    """Declare a settings field with its default and one-line description."""
    return dataclasses.field(default=default, metadata={"help": help})


def _scalar_type(annotation: Any) -> type:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _scalar_type(args[0])
    if annotation in (str, int, float, bool):
        return annotation  # type: ignore[no-any-return]
    raise TypeError(f"unsupported settings type {annotation!r}")


def _parse(kind: type, raw: str, name: str) -> object:
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{name}: expected a boolean, got {raw!r}")
    try:
        return kind(raw)
    except ValueError as exc:
        raise ValueError(f"{name}: expected {kind.__name__}, got {raw!r}") from exc


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """Add one flag per settings field; unset flags stay ``None``."""
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = _scalar_type(hints[field.name])
        flag = "--" + field.name.replace("_", "-")
        env = ENV_PREFIX + field.name.upper()
        help_text = f"{field.metadata.get('help', '')} (env {env}, default {field.default!r})"
        if kind is bool:
            parser.add_argument(
                flag, dest=field.name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            parser.add_argument(flag, dest=field.name, type=kind, default=None, help=help_text)


def load(
    cls: type[S],
    args: argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: object,
) -> S:
    """Build settings from overrides, flags, ``LLMMESH_*`` variables and defaults."""
    env = os.environ if environ is None else environ
    hints = get_type_hints(cls)
    values: dict[str, object] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = field.name
        if name in overrides:
            values[name] = overrides[name]
            continue
        flag_value = getattr(args, name, None) if args is not None else None
        if flag_value is not None:
            values[name] = flag_value
            continue
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _parse(_scalar_type(hints[name]), raw, ENV_PREFIX + name.upper())
    return cls(**values)

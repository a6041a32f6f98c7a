"""A small YAML writer for configuration documents (nested mappings, lists
and scalars), so the project renders YAML without depending on a YAML
library at run time. Output is block style and deterministic."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["to_yaml"]

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
_UNSAFE = re.compile(
    r"[^\x09\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}


def to_yaml(doc: Mapping[str, Any]) -> str:
    """``doc`` as block-style YAML (strings quoted wherever YAML could read
    them as anything else)."""
    return "\n".join(_block(doc, 0)) + "\n"


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _RESERVED:
        return text
    return _quoted(text)


def _quoted(text: str) -> str:
    # JSON's escapes are YAML's; what YAML still refuses or folds inside a
    # double-quoted scalar (DEL, C1 controls, line and paragraph separators,
    # the byte order mark) is escaped by code point.
    body = json.dumps(text, ensure_ascii=False)
    return _UNSAFE.sub(lambda m: _escape(ord(m[0])), body)


def _escape(code: int) -> str:
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _inline(value: object) -> bool:
    return not isinstance(value, Mapping | list | tuple) or not value


def _block(value: Mapping[str, Any] | list[Any] | tuple[Any, ...], indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if _inline(item):
                lines.append(f"{pad}{_scalar(key)}: {_scalar(item)}")
            else:
                lines.append(f"{pad}{_scalar(key)}:")
                lines.extend(_block(item, indent + 2))
        return lines
    for item in value:
        if _inline(item):
            lines.append(f"{pad}- {_scalar(item)}")
            continue
        inner = _block(item, indent + 2)
        lines.append(f"{pad}- {inner[0][indent + 2 :]}")
        lines.extend(inner[1:])
    return lines

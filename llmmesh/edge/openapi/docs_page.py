"""``GET /docs``: the OpenAPI document as a self-contained HTML reference
(no script, nothing fetched from elsewhere, so it works on a closed
network): every operation with its parameters, its request body's fields
(with what the mesh honours or refuses) and its answers."""

from __future__ import annotations

import base64
import hashlib
import html
import json
from functools import cache
from typing import Any

from llmmesh.edge.openapi.document import openapi_document

_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem}"
    "h2{margin-top:2.5rem;font-family:monospace}table{border-collapse:collapse;width:100%}"
    "td,th{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}"
    "code{font-size:.9em}"
)


DOCS_POLICY = (
    "default-src 'none'; "
    f"style-src 'sha256-{base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()}'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
"""The page's Content-Security-Policy: its one inline style (by its hash), nothing else."""


def _resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        resolved: dict[str, Any] = document["components"]["schemas"][name]
        return resolved
    return schema


def _type(schema: dict[str, Any]) -> str:
    """A short description of a schema's type."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(_type(s) for s in schema[key])
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    return " | ".join(kind) if isinstance(kind, list) else str(kind)


def _fields(document: dict[str, Any], schema: dict[str, Any]) -> str:
    body = _resolve(document, schema)
    required = set(body.get("required", []))
    rows = "".join(
        f"<tr><td><code>{html.escape(name)}</code>{' (required)' if name in required else ''}</td>"
        f"<td><code>{html.escape(_type(prop))}</code></td>"
        f"<td>{html.escape(str(prop.get('description', '')))}</td></tr>"
        for name, prop in body.get("properties", {}).items()
    )
    return f"<table><tr><th>field</th><th>type</th><th>notes</th></tr>{rows}</table>" if rows else ""


def _operation(document: dict[str, Any], method: str, path: str, op: dict[str, Any]) -> str:
    parts = [f"<h2>{method.upper()} {html.escape(path)}</h2><p>{html.escape(op.get('summary', ''))}</p>"]
    params = op.get("parameters", [])
    if params:
        rows = "".join(
            f"<tr><td><code>{html.escape(p['name'])}</code></td><td>{p['in']}</td>"
            f"<td>{html.escape(p.get('description', ''))}</td></tr>"
            for p in params
        )
        parts.append(
            f"<h3>Parameters</h3><table><tr><th>name</th><th>in</th><th>notes</th></tr>{rows}</table>"
        )
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body is not None:
        parts.append(f"<h3>Request body</h3>{_fields(document, body)}")
    answers = ", ".join(
        f"{code} {html.escape(r.get('description', ''))}" for code, r in op["responses"].items()
    )
    parts.append(f"<h3>Answers</h3><p>{answers}</p>")
    return "".join(parts)


@cache
def docs_page() -> str:
    """The page (built once; it depends only on the code)."""
    document = openapi_document()
    info = document["info"]
    title = f"{html.escape(info['title'])} {html.escape(info['version'])}"
    sections = [
        _operation(document, method, path, op)
        for path, item in document["paths"].items()
        for method, op in item.items()
        if method in ("get", "post", "delete")
    ]
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(info['title'])}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{title}</h1>"
        f"<p>{html.escape(info['description'])} The machine-readable document is "
        f"<a href='/openapi.json'>/openapi.json</a>.</p>{''.join(sections)}</body></html>"
    )

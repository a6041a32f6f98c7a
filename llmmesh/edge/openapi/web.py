"""The OpenAPI description of the web pages (:mod:`edge.web_routes`) and the
operator API behind the operator page (:mod:`edge.ops`), merged into the
edge's document by :mod:`edge.openapi.document`."""

from __future__ import annotations

from collections.abc import Mapping

from llmmesh.edge.openapi.components import REF, STRING, Schema, ref
from llmmesh.edge.ops import (
    KEY_ID_PATTERN,
    MAX_WINDOW_S,
    PERIOD_PATTERN,
    TENANT_ID_PATTERN,
    CreatedKeyView,
    KeysView,
    KeyView,
    RegionsView,
    UsageView,
)
from llmmesh.edge.traffic_series import INTERVAL_S, TimeSeriesView
from llmmesh.edge.web_routes import ASSETS, CONTENT_SECURITY_POLICY

SECURITY_SCHEMES: dict[str, Schema] = {
    "operatorKey": {
        "type": "http",
        "scheme": "bearer",
        "description": "The edge's operator key (LLMMESH_OPS_KEY); a tenant's API key opens nothing here.",
    }
}


def _schemas() -> dict[str, Schema]:
    out: dict[str, Schema] = {}
    for model in (RegionsView, UsageView, TimeSeriesView, KeysView, CreatedKeyView, KeyView):
        schema = model.model_json_schema(ref_template=REF)
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


SCHEMAS: dict[str, Schema] = _schemas()

_PAGE_HEADERS: dict[str, Schema] = {
    "content-security-policy": {
        "description": f"Always {CONTENT_SECURITY_POLICY!r}: no inline script, nothing from elsewhere.",
        "schema": STRING,
    }
}


def _static(summary: str, media_types: list[str], errors: Mapping[str, Schema]) -> Schema:
    content = {media: {"schema": STRING} for media in media_types}
    ok = {"description": summary, "headers": _PAGE_HEADERS, "content": content}
    return {"summary": summary, "responses": {"200": ok, **errors}, "security": []}


def _query(name: str, description: str, *, required: bool = False, pattern: str = "") -> Schema:
    schema: Schema = {"type": "string", **({"pattern": pattern} if pattern else {})}
    return {"name": name, "in": "query", "required": required, "description": description, "schema": schema}


_ADMIN_NOTE = (
    ". Only on an edge given an admin identity (ops_admin_cert_file): 403 ops_admin_not_configured otherwise."
)


def _path(name: str, description: str, pattern: str) -> Schema:
    schema: Schema = {"type": "string", "pattern": pattern}
    return {"name": name, "in": "path", "required": True, "description": description, "schema": schema}


def paths(errors: Mapping[str, Schema]) -> dict[str, Schema]:
    """The operations, answering ``errors`` besides their 200."""

    def ops_api(summary: str, answer: str, parameters: list[Schema], status: str = "200") -> Schema:
        ok = {"description": summary, "content": {"application/json": {"schema": ref(answer)}}}
        operation: Schema = {
            "summary": summary,
            "responses": {status: ok, **errors},
            "security": [{"operatorKey": []}],
        }
        if parameters:
            operation["parameters"] = parameters
        return operation

    not_found = {"404": errors["404"]}
    asset = _static("A script or the style sheet of the pages.", ["text/javascript", "text/css"], not_found)
    asset["parameters"] = [
        {
            "name": "asset",
            "in": "path",
            "required": True,
            "description": "The file.",
            "schema": {"type": "string", "enum": sorted(ASSETS)},
        }
    ]
    return {
        "/": {
            "get": {
                "summary": "Leads to the chat page.",
                "responses": {
                    "307": {
                        "description": "A redirect to /chat.",
                        "headers": {"location": {"schema": {"type": "string", "const": "/chat"}}},
                    }
                },
                "security": [],
            }
        },
        "/chat": {
            "get": _static(
                "The web chat page: sign in with an API key, stream replies, branches, files.",
                ["text/html"],
                {},
            )
        },
        "/ops": {
            "get": _static(
                "The operator page: regions, charts of the last hour, usage (needs the operator key).",
                ["text/html"],
                {},
            )
        },
        "/web/{asset}": {"get": asset},
        "/ops/api/regions": {
            "get": ops_api(
                "Every region of the directory, asked live for its pods, with its last heartbeat's queue.",
                "RegionsView",
                [],
            )
        },
        "/ops/api/usage": {
            "get": ops_api(
                "A tenant's billed usage in one month, from the global plane.",
                "UsageView",
                [
                    _query("tenant_id", "The tenant's id.", required=True, pattern=TENANT_ID_PATTERN),
                    _query("period", "A month, YYYY-MM; absent for this one.", pattern=PERIOD_PATTERN),
                ],
            )
        },
        "/ops/api/tenants/{tenant}/keys": {
            "get": ops_api(
                f"A tenant's API keys, without secrets{_ADMIN_NOTE}",
                "KeysView",
                [_path("tenant", "The tenant's id.", TENANT_ID_PATTERN)],
            ),
            "post": ops_api(
                f"Creates an API key of the tenant and answers its secret, this once{_ADMIN_NOTE}",
                "CreatedKeyView",
                [_path("tenant", "The tenant's id.", TENANT_ID_PATTERN)],
                "201",
            ),
        },
        "/ops/api/keys/{key_id}/revoke": {
            "post": ops_api(
                f"Revokes an API key at once (edges may trust it for their auth cache's time){_ADMIN_NOTE}",
                "KeyView",
                [_path("key_id", "The key's id.", KEY_ID_PATTERN)],
            )
        },
        "/ops/api/timeseries": {
            "get": ops_api(
                f"This edge's traffic in {INTERVAL_S} s intervals: turns, errors, latency percentiles and "
                "output tokens per region and model; error answers by code; each region's reported load "
                "(queue, capacity, pods; the directory reports no KV-cache use).",
                "TimeSeriesView",
                [
                    {
                        "name": "window",
                        "in": "query",
                        "required": False,
                        "description": f"Seconds back from now; {MAX_WINDOW_S} when absent.",
                        "schema": {"type": "integer", "minimum": INTERVAL_S, "maximum": MAX_WINDOW_S},
                    }
                ],
            )
        },
    }

"""The OpenAPI description of the web pages (:mod:`edge.web_routes`) and the
operator API behind the operator page (:mod:`edge.ops`), merged into the
edge's document by :mod:`edge.openapi`."""

from __future__ import annotations

from collections.abc import Mapping

from llmmesh.edge.openapi.components import REF, STRING, Schema, ref
from llmmesh.edge.ops import PERIOD_PATTERN, TENANT_ID_PATTERN, RegionsView, UsageView
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
    for model in (RegionsView, UsageView):
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


def paths(errors: Mapping[str, Schema]) -> dict[str, Schema]:
    """The operations, answering ``errors`` besides their 200."""

    def ops_api(summary: str, answer: str, parameters: list[Schema]) -> Schema:
        ok = {"description": summary, "content": {"application/json": {"schema": ref(answer)}}}
        operation: Schema = {
            "summary": summary,
            "responses": {"200": ok, **errors},
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
        "/chat": {
            "get": _static(
                "The web chat page: sign in with an API key, stream replies, branches, files.",
                ["text/html"],
                {},
            )
        },
        "/ops": {
            "get": _static(
                "The operator page: regions, pods, queues and usage (needs the operator key).",
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
    }

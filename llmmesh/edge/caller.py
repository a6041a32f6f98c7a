"""The caller behind an HTTP request: its bearer key, authenticated by the
global plane (through the edge's cache)."""

from __future__ import annotations

from starlette.requests import Request

from llmmesh.core import apikeys
from llmmesh.edge.errors import OpenAIError
from llmmesh.edge.mesh_client import MeshClient, Principal
from llmmesh.edge.traffic_series import TRAFFIC


async def authenticate(request: Request, mesh: MeshClient) -> Principal:
    """The caller behind the request's bearer key, or a 401; its tenant
    counts as seen for the operator page (:mod:`edge.traffic_series`)."""
    secret = apikeys.bearer_secret(request.headers.get("authorization"))
    if secret is None:
        raise OpenAIError(
            401,
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
            code="missing_api_key",
        )
    principal = await mesh.authenticate(secret)
    TRAFFIC.tenant_seen(principal.tenant.id)
    return principal

"""Calls on the ``RetrievalService`` of the tenant's zone, and what the
files and vector-store routes share: OpenAI's list shape and list queries.

Files and vector stores live in the zone's store, which every region of the
zone reads, so any serving region of the zone answers (the next one when a
region is unreachable); none outside the zone ever does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Set
from typing import Any, TypeVar

import grpc.aio
from starlette.requests import Request

from llmmesh.edge.caller import authenticate
from llmmesh.edge.mesh_client import MeshClient, Metadata, Principal
from llmmesh.edge.unary_requests import bad_request
from llmmesh.edge.zone_calls import call_in_zone
from llmmesh.v1 import retrieval_service_pb2_grpc

T = TypeVar("T")
_TIMEOUT_S = 120.0
MAX_LIMIT = 100


class RetrievalCalls:
    """One RPC of the tenant's zone's RetrievalService per call."""

    def __init__(self, mesh: MeshClient) -> None:
        self.mesh = mesh

    async def principal(self, request: Request) -> Principal:
        return await authenticate(request, self.mesh)

    async def call(
        self,
        principal: Principal,
        rpc: Callable[[retrieval_service_pb2_grpc.RetrievalServiceStub], Callable[..., Awaitable[T]]],
        message: Any,
    ) -> tuple[T, str]:
        """``rpc`` of the stub with ``message``: its answer and the region that gave it."""

        async def run(channel: grpc.aio.Channel, metadata: Metadata) -> T:
            stub = retrieval_service_pb2_grpc.RetrievalServiceStub(channel)
            return await rpc(stub)(message, metadata=metadata, timeout=_TIMEOUT_S)

        regions = await self.mesh.route(principal.tenant.id, "")
        return await call_in_zone(self.mesh, principal, regions, run)


def list_query(request: Request, extra: Set[str] = frozenset()) -> tuple[int, str, dict[str, str]]:
    """``limit`` (1 to 100, default 20), ``after`` and the ``extra`` fields of
    a list request's query; ``order`` only ``desc`` (newest first, the only
    order kept); any other field, ``before`` included, is a 400 naming it."""
    query: Mapping[str, str] = request.query_params
    for key in query:
        if key not in {"limit", "after", "order", *extra}:
            raise bad_request(f"query parameter {key!r} is not supported", key, "unsupported_parameter")
    if query.get("order", "desc") != "desc":
        raise bad_request("only order=desc (newest first) is served", "order", "unsupported_value")
    raw = query.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise bad_request(f"limit must be an integer from 1 to {MAX_LIMIT}", "limit")
    return int(raw), query.get("after", ""), {k: query[k] for k in extra if k in query}


def list_page(items: list[dict[str, object]], next_token: str, id_key: str = "id") -> dict[str, object]:
    """OpenAI's cursor page."""
    return {
        "object": "list",
        "data": items,
        "first_id": items[0][id_key] if items else None,
        "last_id": items[-1][id_key] if items else None,
        "has_more": bool(next_token),
    }

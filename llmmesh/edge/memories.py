"""``/v1/memories`` (llmmesh's extension): the facts the mesh keeps about a
tenant's end user (OpenAI's ``user``), learned from their turns when the
tenant's policy enables memory (:mod:`region.knowledge.memory`), listed and deleted
in the tenant's zone.

``GET /v1/memories?user=U`` lists them newest first (``limit``, ``after``);
``DELETE /v1/memories/{memory_id}`` deletes one (with ``?user=U``, only
if it is about ``U``); ``DELETE
/v1/memories?user=U`` deletes every fact about ``U``. Listing and deleting
work whatever the policy says, so what was kept can always be removed.
"""

from __future__ import annotations

import grpc.aio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmmesh.edge.caller import authenticate
from llmmesh.edge.mesh_client import MeshClient, Metadata
from llmmesh.edge.retrieval_calls import list_page, list_query
from llmmesh.edge.unary_requests import bad_request
from llmmesh.edge.zone_calls import call_in_zone
from llmmesh.v1 import memory_service_pb2 as pb
from llmmesh.v1 import memory_service_pb2_grpc as pb_grpc

_TIMEOUT_S = 30.0


def memory_object(memory: pb.Memory) -> dict[str, object]:
    return {
        "id": memory.id,
        "object": "llmmesh.memory",
        "user": memory.user,
        "content": memory.content,
        "created_at": memory.created_at,
        "source_request_id": memory.source_request_id,
    }


class MemoryRoutes:
    """The memory routes over the zone's MemoryService."""

    def __init__(self, mesh: MeshClient) -> None:
        self._mesh = mesh

    def routes(self) -> list[Route]:
        return [
            Route("/v1/memories", self.list, methods=["GET"]),
            Route("/v1/memories", self.delete_all, methods=["DELETE"]),
            Route("/v1/memories/{memory_id}", self.delete, methods=["DELETE"]),
        ]

    async def _call(self, request: Request, rpc: str, message: object) -> object:
        principal = await authenticate(request, self._mesh)

        async def run(channel: grpc.aio.Channel, metadata: Metadata) -> object:
            stub = pb_grpc.MemoryServiceStub(channel)
            return await getattr(stub, rpc)(message, metadata=metadata, timeout=_TIMEOUT_S)

        regions = await self._mesh.route(principal.tenant.id, "")
        answer, _ = await call_in_zone(self._mesh, principal, regions, run)
        return answer

    async def list(self, request: Request) -> Response:
        limit, after, extra = list_query(request, {"user"})
        user = extra.get("user", "")
        if not user:
            raise bad_request(
                "user is required: the end user the facts are about", "user", "missing_required_parameter"
            )
        answer = await self._call(
            request, "ListMemories", pb.ListMemoriesRequest(user=user, page_size=limit, page_token=after)
        )
        assert isinstance(answer, pb.ListMemoriesResponse)
        return JSONResponse(list_page([memory_object(m) for m in answer.memories], answer.next_page_token))

    async def delete_all(self, request: Request) -> Response:
        for key in request.query_params:
            if key != "user":
                raise bad_request(f"query parameter {key!r} is not supported", key, "unsupported_parameter")
        user = request.query_params.get("user", "")
        if not user:
            raise bad_request(
                "user is required: the end user whose facts to delete", "user", "missing_required_parameter"
            )
        answer = await self._call(request, "DeleteMemories", pb.DeleteMemoriesRequest(user=user))
        assert isinstance(answer, pb.DeleteMemoriesResponse)
        return JSONResponse({"object": "llmmesh.memory.deleted", "user": user, "deleted": answer.deleted})

    async def delete(self, request: Request) -> Response:
        memory_id = request.path_params["memory_id"]
        for key in request.query_params:
            if key != "user":
                raise bad_request(f"query parameter {key!r} is not supported", key, "unsupported_parameter")
        # With ?user=U, only U's fact of that id: a 404 when it is about someone else.
        user = request.query_params.get("user", "")
        message = pb.DeleteMemoriesRequest(memory_id=memory_id, user=user)
        answer = await self._call(request, "DeleteMemories", message)
        assert isinstance(answer, pb.DeleteMemoriesResponse)
        return JSONResponse({"id": memory_id, "object": "llmmesh.memory.deleted", "deleted": answer.deleted})

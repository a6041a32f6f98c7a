"""``MemoryService``: an end user's facts, listed and deleted by the tenant's keys."""

from __future__ import annotations

from llmmesh.core.end_user import require_end_user
from llmmesh.core.errors import InvalidArgument, MeshError, Reason
from llmmesh.region.grpc_caller import Context, caller_secret
from llmmesh.region.knowledge.memory_store import MemoryStore
from llmmesh.region.knowledge.retrieval import page_size
from llmmesh.region.policy_cache import PolicyCache
from llmmesh.v1 import memory_service_pb2 as pb
from llmmesh.v1 import memory_service_pb2_grpc as pb_grpc

MEMORY_SERVICE_NAME = "llmmesh.v1.MemoryService"
MEMORY_METHODS = tuple(m.name for m in pb.DESCRIPTOR.services_by_name["MemoryService"].methods)


def _user(user: str) -> str:
    if not user:
        raise InvalidArgument(
            Reason.INVALID_REQUEST,
            "user is required: the end user the facts are about",
            metadata={"param": "user"},
        )
    require_end_user(user)
    return user


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    """Lists and deletes facts; the tenant is the caller's."""

    def __init__(self, policy: PolicyCache, store: MemoryStore) -> None:
        self._policy = policy
        self._store = store

    async def ListMemories(
        self, request: pb.ListMemoriesRequest, context: Context
    ) -> pb.ListMemoriesResponse:
        try:
            caller = await self._policy.authenticate_fresh(caller_secret(context))
            page = await self._store.recall(
                caller.tenant_id, _user(request.user), page_size(request.page_size), request.page_token
            )
        except MeshError as err:
            await err.abort(context)
        return pb.ListMemoriesResponse(
            memories=[
                pb.Memory(
                    id=row.id,
                    user=row.end_user,
                    content=row.content,
                    created_at=int(row.created_at.timestamp()),
                    source_request_id=row.source_request_id,
                )
                for row in page.rows
            ],
            next_page_token=page.next_after,
        )

    async def DeleteMemories(
        self, request: pb.DeleteMemoriesRequest, context: Context
    ) -> pb.DeleteMemoriesResponse:
        try:
            caller = await self._policy.authenticate_fresh(caller_secret(context))
            if request.memory_id:
                # With a user too, only that user's fact of that id.
                user = _user(request.user) if request.user else ""
                deleted = await self._store.forget(caller.tenant_id, memory_id=request.memory_id, user=user)
            else:
                deleted = await self._store.forget(caller.tenant_id, user=_user(request.user))
        except MeshError as err:
            await err.abort(context)
        return pb.DeleteMemoriesResponse(deleted=deleted)

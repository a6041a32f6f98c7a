"""``EndUserService``: the pseudonym of an end user of a tenant of this
region's zone, for an operator to ask billing by (an admin certificate's
only; another plane holding the oracle could test guesses of raw ids
against the pseudonyms it keeps)."""

from __future__ import annotations

from llmmesh.core.end_user import require_end_user
from llmmesh.core.errors import InvalidArgument, MeshError, NotFound, Reason
from llmmesh.region.end_user_pseudonyms import EndUserPseudonyms
from llmmesh.region.grpc_caller import Context
from llmmesh.region.policy_cache import PolicyCache
from llmmesh.v1 import end_user_service_pb2 as pb
from llmmesh.v1 import end_user_service_pb2_grpc as pb_grpc

END_USER_SERVICE_NAME = "llmmesh.v1.EndUserService"
END_USER_METHODS = tuple(m.name for m in pb.DESCRIPTOR.services_by_name["EndUserService"].methods)


class EndUserServicer(pb_grpc.EndUserServiceServicer):
    """Pseudonyms of the zone's end users, for tenants the zone's policy snapshot names."""

    def __init__(self, zone: str, policy: PolicyCache, pseudonyms: EndUserPseudonyms) -> None:
        self._zone = zone
        self._policy = policy
        self._pseudonyms = pseudonyms

    def _of_zone(self, tenant_id: str) -> bool:
        return self._policy.tenant(tenant_id) is not None or tenant_id in self._policy.deleted_tenant_ids()

    async def _require_tenant(self, tenant_id: str) -> None:
        if not tenant_id:
            raise InvalidArgument(
                Reason.INVALID_REQUEST, "tenant_id is required", metadata={"param": "tenant_id"}
            )
        if not self._of_zone(tenant_id):
            # A tenant made since the last snapshot is known after a refresh.
            await self._policy.refresh()
        if not self._of_zone(tenant_id):
            raise NotFound(
                Reason.TENANT_NOT_FOUND,
                f"no tenant {tenant_id!r} in zone {self._zone!r}: ask a region of the tenant's zone",
                metadata={"param": "tenant_id", "zone": self._zone},
            )

    async def PseudonymizeEndUser(
        self, request: pb.PseudonymizeEndUserRequest, context: Context
    ) -> pb.PseudonymizeEndUserResponse:
        try:
            await self._require_tenant(request.tenant_id)
            if not request.end_user:
                raise InvalidArgument(
                    Reason.INVALID_REQUEST, "end_user is required", metadata={"param": "end_user"}
                )
            require_end_user(request.end_user, "end_user")
            pseudonym = await self._pseudonyms.of(request.tenant_id, request.end_user)
        except MeshError as err:
            await err.abort(context)
        return pb.PseudonymizeEndUserResponse(pseudonym=pseudonym, zone=self._zone)

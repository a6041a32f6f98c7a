"""Who may call which global-plane RPC (see :mod:`llmmesh.core.access`).

Changes to tenants, keys and models are an operator's (an admin
certificate); regions report heartbeats and usage for themselves only
(checked per request in the servicers); the edge authenticates keys and
routes turns.
"""

from __future__ import annotations

from llmmesh.core.identity import Role

_ADMIN = (Role.ADMIN,)
_READERS = (Role.EDGE, Role.REGION, Role.ADMIN)

GLOBAL_ACCESS = {
    # PolicyService
    "CreateTenant": _ADMIN,
    "GetTenant": _ADMIN,
    "ListTenants": _ADMIN,
    "UpdateTenant": _ADMIN,
    "DeleteTenant": _ADMIN,
    "CreateApiKey": _ADMIN,
    "RevokeApiKey": _ADMIN,
    "ListApiKeys": _ADMIN,
    "ListAuditEvents": _ADMIN,
    "AuthenticateKey": (Role.EDGE, Role.REGION, Role.ADMIN),
    "GetPolicySnapshot": (Role.REGION,),
    # BillingService
    "RecordUsage": (Role.REGION,),
    "GetUsage": _READERS,
    "ReconcileUsage": (Role.REGION, Role.ADMIN),
    # ModelRegistryService
    "ListModels": (*_READERS, Role.CLIENT),
    "GetModel": (*_READERS, Role.CLIENT),
    "ResolveModel": _READERS,
    "UpsertModel": _ADMIN,
    # GeoRoutingService
    "Route": (Role.EDGE, Role.ADMIN),
    "Heartbeat": (Role.REGION,),
    "ListRegions": _READERS,
    "RemoveRegion": _ADMIN,
}

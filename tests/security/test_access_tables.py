"""Every RPC of every service a plane serves has an access rule, and the
rules of the tenant-content, routing and admin RPCs are the narrow ones.

A method without a rule is refused to everyone (the policy's default), so a
forgotten rule shows as a service nobody can use; these tests name the
method instead, and fail when a new service is served by no plane."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Collection, Mapping

from google.protobuf import descriptor_pool

import llmmesh.v1
from llmmesh.core.identity import Role
from llmmesh.engine.server import ENGINE_ACCESS
from llmmesh.globalplane.access import GLOBAL_ACCESS
from llmmesh.region.server import REGION_ACCESS


def _declared_services() -> set[str]:
    """Every service of every generated module of the package, found, not listed."""
    names: set[str] = set()
    for module in pkgutil.iter_modules(llmmesh.v1.__path__):
        if module.name.endswith("_pb2"):
            loaded = importlib.import_module(f"llmmesh.v1.{module.name}")
            names.update(loaded.DESCRIPTOR.services_by_name)
    return names


PLANES: dict[str, tuple[Mapping[str, Collection[Role]], tuple[str, ...]]] = {
    "engine": (ENGINE_ACCESS, ("EngineService", "EmbeddingService")),
    "region": (
        REGION_ACCESS,
        (
            "ChatService",
            "RegionEmbeddingService",
            "ModerationService",
            "RetrievalService",
            "MemoryService",
            "EndUserService",
        ),
    ),
    "global": (
        GLOBAL_ACCESS,
        ("PolicyService", "BillingService", "ModelRegistryService", "GeoRoutingService"),
    ),
}
"""Each plane's access table and the llmmesh.v1 services its server registers."""


def _methods(service: str) -> list[str]:
    found = descriptor_pool.Default().FindServiceByName(f"llmmesh.v1.{service}")
    return [method.name for method in found.methods]


def test_every_service_of_the_package_is_served_by_a_plane() -> None:
    declared = _declared_services()
    served = {service for _, services in PLANES.values() for service in services}
    assert declared == served, f"served by no plane: {declared - served}; unknown: {served - declared}"


def test_every_method_a_plane_serves_has_a_rule() -> None:
    for plane, (table, services) in PLANES.items():
        for service in services:
            missing = [m for m in _methods(service) if not table.get(m)]
            assert not missing, f"{plane}: {service} methods without an access rule: {missing}"


def test_a_plane_s_rules_name_only_methods_it_serves() -> None:
    for plane, (table, services) in PLANES.items():
        served = {m for service in services for m in _methods(service)}
        assert set(table) <= served, f"{plane}: rules for methods it does not serve: {set(table) - served}"


def test_no_two_services_of_a_plane_share_a_method_name() -> None:
    """Rules are keyed by a method's short name: two services with one name would share a rule."""
    for plane, (_, services) in PLANES.items():
        names = [m for service in services for m in _methods(service)]
        assert len(names) == len(set(names)), f"{plane}: a method name is served twice: {sorted(names)}"


def test_tenant_content_is_reached_only_as_turns_are() -> None:
    speakers = {Role.EDGE, Role.CLIENT, Role.ADMIN}
    for service in ("RetrievalService", "MemoryService"):
        for method in _methods(service):
            assert set(REGION_ACCESS[method]) == speakers, method
    assert set(REGION_ACCESS["ListBranches"]) == speakers
    # No plane of the mesh (a pod, another region, the global plane) reads a tenant's content.
    for method, roles in REGION_ACCESS.items():
        if method != "GetRegionInfo":
            assert not {Role.ENGINE, Role.REGION, Role.GLOBAL} & set(roles), method


def test_only_an_operator_may_ask_for_an_end_user_s_pseudonym() -> None:
    """Any other holder of the oracle could test guesses of raw end-user ids against the pseudonyms."""
    for method in _methods("EndUserService"):
        assert set(REGION_ACCESS[method]) == {Role.ADMIN}, method


def test_registry_and_directory_changes_are_an_operator_s() -> None:
    for method in ("UpsertModel", "RemoveRegion", "CreateTenant", "UpdateTenant", "CreateApiKey"):
        assert set(GLOBAL_ACCESS[method]) == {Role.ADMIN}, method


def test_only_the_owning_region_makes_a_pod_work_and_an_operator_may_look() -> None:
    work = {"Generate", "GenerateSession", "CancelGeneration", "Embed"}
    for method in _methods("EngineService") + _methods("EmbeddingService"):
        expected = {Role.REGION} if method in work else {Role.REGION, Role.ADMIN}
        assert set(ENGINE_ACCESS[method]) == expected, method
    assert work <= set(ENGINE_ACCESS)

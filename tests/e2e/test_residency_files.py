"""Residency of files, chunks, their embeddings and retrieval, proved on the
running mesh: an ``eu`` tenant's uploaded file, its chunks and their
vectors are stored only in the ``eu`` zone's retrieval store, the
embeddings that indexed them ran (and were metered) only in ``eu`` regions,
a chat turn citing them ran in ``eu``, and the ``us`` zone holds none of it
and processed none of it. The same holds for the facts memory keeps about
an eu tenant's end user."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import sqlalchemy as sa

from llmmesh.core.identity import Role, role_name
from llmmesh.core.sqlstore import create_store_engine
from llmmesh.region.knowledge.memory_store import memories
from llmmesh.region.knowledge.vector_store_index import retrieval_database_url
from llmmesh.region.knowledge.vector_store_schema import RETRIEVAL_TABLES
from llmmesh.v1 import policy_service_pb2, policy_service_pb2_grpc
from tests.e2e.conftest import NO_TENANT_ROWS, RunningMesh, pod_counters, tenant_rows
from tests.e2e.test_residency import auth

pytestmark = pytest.mark.e2e
POLL_S, WAIT_S = 0.2, 30.0
TEXT = "Das Fahrrad von Greta Holm steht im Keller des Rathauses in Bremen."


def retrieval_rows(mesh: RunningMesh, zone: str, tenant_id: str) -> dict[str, list[dict[str, object]]]:
    """Every retrieval row of ``tenant_id`` in ``zone``'s retrieval store, by table."""
    engine = create_store_engine(retrieval_database_url(mesh.store_url(zone)))
    try:
        with engine.connect() as conn:
            return {
                table.name: [
                    dict(row._mapping)
                    for row in conn.execute(sa.select(table).where(table.c.tenant_id == tenant_id))
                ]
                for table in RETRIEVAL_TABLES
            }
    finally:
        engine.dispose()


def test_an_eu_tenants_files_chunks_and_vectors_stay_in_eu(mesh: RunningMesh) -> None:
    eu, us = mesh.tenant_id("eu"), mesh.tenant_id("us")
    eu_regions = mesh.regions_in("eu")
    us_before = pod_counters(mesh.pod_metrics_urls("us"))
    us_usage_before = tenant_rows(mesh.store_url("us"), eu)
    with httpx.Client(base_url=f"{mesh.edge_url}/v1", headers=auth(mesh.key("eu")), timeout=120) as http:
        uploaded = http.post(
            "/files", files={"file": ("fahrrad.txt", TEXT.encode())}, data={"purpose": "assistants"}
        )
        assert uploaded.status_code == 200, uploaded.text
        file_id = uploaded.json()["id"]
        assert file_id.startswith("file-eu-") and uploaded.headers["x-llmmesh-region"] in eu_regions
        store = http.post("/vector_stores", json={"name": "kb", "file_ids": [file_id]})
        assert store.status_code == 200, store.text
        store_id = store.json()["id"]
        assert store_id.startswith("vs_eu_") and store.headers["x-llmmesh-region"] in eu_regions
        found = http.post(f"/vector_stores/{store_id}/search", json={"query": "Wo steht das Fahrrad?"})
        assert found.status_code == 200, found.text
        assert found.json()["data"][0]["file_id"] == file_id
        assert found.headers["x-llmmesh-region"] in eu_regions
        turn = http.post(
            "/chat/completions",
            json={
                "model": "auto",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "Wo steht das Fahrrad von Greta?"}],
                "llmmesh_retrieval": {"vector_store_ids": [store_id]},
            },
        )
        assert turn.status_code == 200, turn.text
        assert turn.json()["llmmesh_citations"][0]["file_id"] == file_id
        assert turn.headers["x-llmmesh-region"] in eu_regions
    with httpx.Client(base_url=f"{mesh.edge_url}/v1", headers=auth(mesh.key("us")), timeout=60) as http:
        # To the us tenant the eu file does not exist.
        assert http.get(f"/files/{file_id}").status_code == 404
        assert http.post(f"/vector_stores/{store_id}/search", json={"query": "Fahrrad"}).status_code == 404

    rows = retrieval_rows(mesh, "eu", eu)
    assert [f["id"] for f in rows["retrieval_files"]] == [file_id]
    content = rows["retrieval_files"][0]["content"]
    assert isinstance(content, bytes) and content == TEXT.encode()
    chunks = rows["retrieval_chunks"]
    assert chunks and all(c["vector_store_id"] == store_id and c["embedding"] for c in chunks)
    assert {str(r["home_region"]) for t in rows.values() for r in t} <= eu_regions
    # The embeddings that indexed the file were metered in eu's store, by eu regions.
    metered = tenant_rows(mesh.store_url("eu"), eu)["usage_outbox"]
    assert any(str(r["request_id"]).startswith("emb_") for r in metered)
    assert {str(r["home_region"]) for r in metered} <= eu_regions
    # Not a byte of it in us: no file, chunk or vector, no usage, no work at its pods.
    assert retrieval_rows(mesh, "us", eu) == {t.name: [] for t in RETRIEVAL_TABLES}
    assert tenant_rows(mesh.store_url("us"), eu) == us_usage_before == NO_TENANT_ROWS
    assert pod_counters(mesh.pod_metrics_urls("us")) == us_before
    assert retrieval_rows(mesh, "us", us)["retrieval_files"] == []


async def _set_memory(mesh: RunningMesh, tenant_id: str, enabled: bool) -> None:
    async with mesh.channel(str(mesh.info["global_address"]), role_name(Role.GLOBAL)) as channel:
        policy = policy_service_pb2_grpc.PolicyServiceStub(channel)
        tenant = policy_service_pb2.Tenant(id=tenant_id, memory_enabled=enabled)
        request = policy_service_pb2.UpdateTenantRequest(tenant=tenant, update_fields=["memory_enabled"])
        await policy.UpdateTenant(request, timeout=10)


def memory_rows(mesh: RunningMesh, zone: str, tenant_id: str) -> list[dict[str, object]]:
    engine = create_store_engine(retrieval_database_url(mesh.store_url(zone)))
    try:
        with engine.connect() as conn:
            query = sa.select(memories).where(memories.c.tenant_id == tenant_id)
            return [dict(row._mapping) for row in conn.execute(query)]
    finally:
        engine.dispose()


def test_an_eu_end_users_memories_stay_in_eu(mesh: RunningMesh) -> None:
    eu = mesh.tenant_id("eu")
    asyncio.run(_set_memory(mesh, eu, True))
    try:
        turn = {
            "model": "auto",
            "max_tokens": 4,
            "user": "greta",
            "messages": [{"role": "user", "content": "My name is Greta Holm and I live in Bremen."}],
        }
        found: list[dict[str, object]] = []
        with httpx.Client(base_url=f"{mesh.edge_url}/v1", headers=auth(mesh.key("eu")), timeout=60) as http:
            # The regions learn of the policy at their next snapshot: a turn
            # until one is learned from (bounded).
            deadline = time.monotonic() + WAIT_S
            while not found and time.monotonic() < deadline:
                resp = http.post("/chat/completions", json=turn)
                assert resp.status_code == 200, resp.text
                assert resp.headers["x-llmmesh-region"] in mesh.regions_in("eu")
                time.sleep(POLL_S)
                listed = http.get("/memories", params={"user": "greta"})
                assert listed.status_code == 200, listed.text
                found = listed.json()["data"]
        assert {str(f["content"]) for f in found} == {
            "The user's name is Greta Holm.",
            "The user lives in Bremen.",
        }
        rows = memory_rows(mesh, "eu", eu)
        assert {str(r["content"]) for r in rows} == {str(f["content"]) for f in found}
        assert {str(r["home_region"]) for r in rows} <= mesh.regions_in("eu")
        assert memory_rows(mesh, "us", eu) == []
        with httpx.Client(base_url=f"{mesh.edge_url}/v1", headers=auth(mesh.key("us")), timeout=60) as http:
            assert http.get("/memories", params={"user": "greta"}).json()["data"] == []
    finally:
        asyncio.run(_set_memory(mesh, eu, False))

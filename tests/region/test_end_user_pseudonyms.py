"""End-user ids leave their zone only as pseudonyms: an eu tenant's turn for
end user "zed" reaches billing under the zone's pseudonym of it (no row of
the global store holds "zed"), every region of the zone computes the same
one, and ``llmmesh admin usage --end-user zed`` finds the turn through a
region of the zone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import sqlalchemy as sa

from llmmesh.cli.main import main
from llmmesh.core.end_user import is_end_user_pseudonym
from llmmesh.core.errors import from_rpc_error
from llmmesh.core.grpcserver import open_channel
from llmmesh.region.end_user_pseudonyms import EndUserPseudonyms
from llmmesh.region.zone_store.store import ZoneStore
from llmmesh.v1 import billing_service_pb2 as bpb
from llmmesh.v1 import (
    billing_service_pb2_grpc,
    chat_service_pb2,
    chat_service_pb2_grpc,
    common_pb2,
    end_user_service_pb2_grpc,
)
from llmmesh.v1 import end_user_service_pb2 as epb
from tests.multiregion import MultiRegionMesh, RegionSpec, running_multiregion

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
async def test_two_regions_of_a_zone_starting_at_once_agree_on_its_pseudonyms(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        request.getfixturevalue("postgres_schema_url")
        if store == "postgresql"
        else f"sqlite:///{tmp_path / 'zone-eu.db'}"
    )
    west = await ZoneStore.open(url, "eu", "eu-west")
    central = await ZoneStore.open(url, "eu", "eu-central")
    us = await ZoneStore.open(f"sqlite:///{tmp_path / 'zone-us.db'}", "us", "us-east")
    try:
        # Each region offers a key of its own at once; one lands, and both compute with it.
        of_west, of_central = EndUserPseudonyms(west), EndUserPseudonyms(central)
        zed_west, zed_central = await asyncio.gather(
            of_west.of("ten_a", "zed"), of_central.of("ten_a", "zed")
        )
        assert zed_west == zed_central and is_end_user_pseudonym(zed_west)
        # A region started later reads the key the zone has.
        assert await EndUserPseudonyms(central).of("ten_a", "zed") == zed_west
        # Another tenant's "zed", and the same tenant id's in another zone, are other end users.
        assert await of_west.of("ten_b", "zed") != zed_west
        assert await EndUserPseudonyms(us).of("ten_a", "zed") != zed_west
        assert await of_west.of("ten_a", "") == ""
    finally:
        for opened in (west, central, us):
            opened.dispose()


async def _global_cells(mesh: MultiRegionMesh) -> list[str]:
    """Every text or binary value of every row of every table of the global
    store, read in one of the store's own transactions (its planes write
    meanwhile)."""

    def read(conn: sa.Connection) -> list[str]:
        cells: list[str] = []
        for name in sa.inspect(conn).get_table_names():
            for row in conn.execute(sa.text(f'SELECT * FROM "{name}"')):
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        cells.append(bytes(value).decode("latin-1"))
                    elif value is not None:
                        cells.append(str(value))
        return cells

    return await mesh.global_plane.store.transaction(read)


async def _turn(address: str, key: str, user: str) -> list[chat_service_pb2.ChatResponse]:
    start = chat_service_pb2.ChatStart(
        model="auto",
        messages=[common_pb2.ChatMessage(role=common_pb2.CHAT_ROLE_USER, content="Wie geht's?")],
        sampling=common_pb2.SamplingParams(max_tokens=6),
        user=user,
    )
    async with open_channel(address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(
            metadata=(("authorization", f"Bearer {key}"),)
        )
        await call.write(chat_service_pb2.ChatRequest(start=start))
        await call.done_writing()
        return [event async for event in call]


async def _pseudonymize(address: str, tenant_id: str, end_user: str) -> epb.PseudonymizeEndUserResponse:
    async with open_channel(address) as channel:
        stub = end_user_service_pb2_grpc.EndUserServiceStub(channel)
        answer: epb.PseudonymizeEndUserResponse = await stub.PseudonymizeEndUser(
            epb.PseudonymizeEndUserRequest(tenant_id=tenant_id, end_user=end_user), timeout=5
        )
        return answer


async def _billed_to_raw_id(address: str, tenant_id: str, end_user: str) -> None:
    async with open_channel(address) as channel:
        stub = billing_service_pb2_grpc.BillingServiceStub(channel)
        await stub.GetUsage(bpb.GetUsageRequest(tenant_id=tenant_id, end_user=end_user), timeout=5)


def _admin_usage(capsys: pytest.CaptureFixture[str], address: str, *argv: str) -> tuple[int, Any, str]:
    status = main(["admin", "usage", *argv, "--global-address", address, "--insecure", "--json"])
    out, err = capsys.readouterr()
    return status, json.loads(out) if status == 0 else None, err


async def test_an_eu_end_user_reaches_billing_only_as_its_zone_s_pseudonym(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    specs = [RegionSpec("eu-west", "eu"), RegionSpec("eu-central", "eu"), RegionSpec("us-east", "us")]
    async with running_multiregion(specs, store_dir=tmp_path) as mesh:
        tenant_id, key = await mesh.new_key("eu")
        west = mesh.plane("eu-west")
        events = await _turn(west.address, key, "zed")
        usage = next(e.usage.usage for e in events if e.HasField("usage"))
        await west.gateway.drain()
        assert await west.shipper.flush(timeout_s=10), "usage not delivered"

        # Not a row of the global store holds the raw id (a pseudonym may spell anything).
        leaked = [c for c in await _global_cells(mesh) if "zed" in c.lower() and not is_end_user_pseudonym(c)]
        assert leaked == []
        # Both regions of the zone name "zed" alike, and billing holds the turn under that name.
        by_west = await _pseudonymize(west.address, tenant_id, "zed")
        by_central = await _pseudonymize(mesh.plane("eu-central").address, tenant_id, "zed")
        assert by_west == by_central and by_west.zone == "eu"
        billed = await mesh.global_plane.ledger.usage(tenant_id, "", end_user=by_west.pseudonym)
        assert (billed.requests, billed.input_tokens, billed.output_tokens) == (
            1,
            usage.input_tokens,
            usage.output_tokens,
        )

        # The operator's path: the CLI asks a region of the tenant's zone, then billing.
        address = mesh.global_plane.address
        status, answer, err = await asyncio.to_thread(
            _admin_usage, capsys, address, tenant_id, "--end-user", "zed"
        )
        assert status == 0, err
        assert answer["end_user"] == "zed" and answer["end_user_pseudonym"] == by_west.pseudonym
        assert (answer["requests"], answer["input_tokens"], answer["output_tokens"]) == (
            "1",
            str(usage.input_tokens),
            str(usage.output_tokens),
        )
        # Billing refuses to be asked by the raw id, saying why.
        with pytest.raises(grpc.aio.AioRpcError) as asked:
            await _billed_to_raw_id(address, tenant_id, "zed")
        refused = from_rpc_error(asked.value)
        assert (refused.code, refused.reason, refused.metadata["param"]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "END_USER_NOT_PSEUDONYMOUS",
            "end_user",
        )
        # A region names only its own zone's tenants' end users, and asks for one.
        with pytest.raises(grpc.aio.AioRpcError) as elsewhere:
            await _pseudonymize(mesh.plane("us-east").address, tenant_id, "zed")
        assert from_rpc_error(elsewhere.value).reason == "TENANT_NOT_FOUND"
        with pytest.raises(grpc.aio.AioRpcError) as nobody:
            await _pseudonymize(west.address, tenant_id, "")
        assert from_rpc_error(nobody.value).metadata["param"] == "end_user"

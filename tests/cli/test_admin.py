"""``llmmesh admin`` in-process against a real global plane process
(``llmmesh global``) serving mutual TLS with certificates of a temporary
mesh CA; the commands present its admin certificate (``--certs-dir``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import pytest

from llmmesh.cli import admin as admin_cli
from llmmesh.cli.main import main
from llmmesh.core.end_user import end_user_pseudonym
from llmmesh.core.grpcserver import open_channel
from llmmesh.core.identity import PlaneIdentity, Role, role_name
from llmmesh.core.mtls import holder_security
from llmmesh.topology.mesh_certs import ensure_mesh_certs
from llmmesh.v1 import billing_service_pb2 as bpb
from llmmesh.v1 import (
    billing_service_pb2_grpc,
    common_pb2,
    geo_routing_service_pb2_grpc,
    policy_service_pb2_grpc,
)
from llmmesh.v1 import geo_routing_service_pb2 as gpb
from llmmesh.v1 import policy_service_pb2 as ppb

STARTUP_TIMEOUT_S = 60.0


HOLDERS = [
    PlaneIdentity(Role.GLOBAL, "global"),
    PlaneIdentity(Role.ADMIN, "admin"),
    PlaneIdentity(Role.CLIENT, "client"),
    PlaneIdentity(Role.REGION, "us-east", "us", "us-east"),
    PlaneIdentity(Role.REGION, "eu-west", "eu", "eu-west"),
]
ADMIN_URI = "spiffe://llmmesh/admin/-/-/admin"
USER_42 = end_user_pseudonym(b"k" * 32, "ten_billed", "user-42")
"""An end user as billing knows it: by the pseudonym its zone computed."""


@dataclass(frozen=True)
class GlobalProcess:
    """A running ``llmmesh global`` and the certificate directory of its mesh."""

    address: str
    certs: Path

    def channel(self, stem: str = "admin") -> grpc.aio.Channel:
        """A channel presenting the certificate ``stem`` (admin, region-us-east…)."""
        return open_channel(self.address, holder_security(stem, directory=self.certs), role_name(Role.GLOBAL))


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GlobalProcess]:
    """A ``llmmesh global`` process on a port of its own, with a fresh SQLite store, serving mTLS."""
    home = tmp_path_factory.mktemp("admin-home")
    files = ensure_mesh_certs(home / "certs", HOLDERS)["global"]
    ready = home / "global.ready.json"
    command = [sys.executable, "-m", "llmmesh", "global", "--port", "0", "--ready-file", str(ready)]
    command += ["--database-url", f"sqlite:///{home / 'global.db'}", "--dev-key", "", "--zones", "us,eu"]
    command += ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca)]
    with (home / "global.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not ready.exists():
            assert process.poll() is None, (home / "global.log").read_text()
            assert time.monotonic() < deadline, "the global plane did not become ready"
            time.sleep(0.05)
        yield GlobalProcess(str(json.loads(ready.read_text())["address"]), home / "certs")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def admin(capsys: pytest.CaptureFixture[str], plane: GlobalProcess, *argv: str) -> tuple[int, str, str]:
    """Run ``llmmesh admin ARGV`` against ``plane`` with its mesh's admin certificate;
    its status, stdout and stderr."""
    return admin_as(capsys, plane.address, *argv, "--certs-dir", str(plane.certs))


def admin_as(capsys: pytest.CaptureFixture[str], address: str, *argv: str) -> tuple[int, str, str]:
    """Run ``llmmesh admin ARGV --global-address ADDRESS``, with no certificate flags of its own."""
    status = main(["admin", *argv, "--global-address", address])
    out, err = capsys.readouterr()
    return status, out, err


def admin_json(capsys: pytest.CaptureFixture[str], plane: GlobalProcess, *argv: str) -> object:
    status, out, err = admin(capsys, plane, *argv, "--json")
    assert status == 0, err
    return json.loads(out)


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("llmmesh admin: "), err
    return lines[0]


async def _authenticate(plane: GlobalProcess, secret: str) -> ppb.AuthenticateKeyResponse:
    async with plane.channel() as channel:
        stub = policy_service_pb2_grpc.PolicyServiceStub(channel)
        response: ppb.AuthenticateKeyResponse = await stub.AuthenticateKey(
            ppb.AuthenticateKeyRequest(secret=secret)
        )
        return response


def test_tenant_create_and_list(capsys: pytest.CaptureFixture[str], plane: GlobalProcess) -> None:
    status, out, _ = admin(
        capsys, plane, "tenant", "create", "acme", "--zone", "eu", "--tier", "pro",
        "--rpm", "60", "--tpm", "10000", "--models", "llmmesh-tiny, other", "--retention-days", "7",
        "--memory",
    )  # fmt: skip
    assert status == 0
    header, row = out.strip().splitlines()
    assert header.split()[:4] == ["NAME", "ID", "ZONE", "TIER"]
    assert row.split()[0] == "acme" and row.split()[2:7] == ["eu", "pro", "60", "10000", "unlimited"]
    assert row.split()[7] == "llmmesh-tiny,other"
    listed = admin_json(capsys, plane, "tenant", "list", "--zone", "eu")
    assert isinstance(listed, list)
    acme = next(t for t in listed if t["name"] == "acme")
    assert (acme["zone"], acme["tier"], acme["rpm_limit"]) == (
        "eu",
        "TIER_PRO",
        "60",
    )  # proto3 JSON: int64 as string
    assert acme["allowed_models"] == ["llmmesh-tiny", "other"]
    assert acme["conversation_retention_days"] == 7
    assert acme["memory_enabled"] is True
    assert admin_json(capsys, plane, "tenant", "list", "--zone", "nowhere") == []


def test_duplicate_tenant_is_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess
) -> None:
    assert admin(capsys, plane, "tenant", "create", "twice", "--zone", "us", "--tier", "free")[0] == 0
    status, _, err = admin(capsys, plane, "tenant", "create", "twice", "--zone", "us", "--tier", "free")
    assert status == 2
    assert one_error_line(err) == "llmmesh admin: tenant 'twice' already exists (TENANT_EXISTS)"


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--zone", "eu-west"], "is not a zone name"),
        (["--zone", "EU"], "is not a zone name"),
        (["--zone", "eu", "--rpm", "-5"], "rpm_limit must be >= 0"),
        (["--zone", "eu", "--quota", "-1"], "monthly_token_quota must be >= 0"),
        (["--zone", "eu", "--retention-days", "-1"], "conversation_retention_days must be 0"),
    ],
)
def test_bad_tenant_input_is_rejected(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess, flags: list[str], needle: str
) -> None:
    status, out, err = admin(capsys, plane, "tenant", "create", "bad", "--tier", "pro", *flags)
    assert (status, out) == (2, "")
    line = one_error_line(err)
    assert needle in line and line.endswith("(INVALID_REQUEST)")


def test_key_create_shows_the_secret_once_and_revoke_stops_it(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess
) -> None:
    assert admin(capsys, plane, "tenant", "create", "keyed", "--zone", "eu", "--tier", "pro")[0] == 0
    status, out, _ = admin(capsys, plane, "key", "create", "keyed", "--expires-in-days", "30")
    assert status == 0
    fields = dict(line.split(maxsplit=1) for line in out.splitlines()[:4])
    assert fields["secret"].startswith("sk-llmmesh-") and fields["expires"] != "never"
    authed = asyncio.run(_authenticate(plane, fields["secret"]))
    assert (authed.tenant.name, authed.key_id) == ("keyed", fields["key"].removeprefix("id").strip())
    created = admin_json(capsys, plane, "key", "create", "keyed")
    assert isinstance(created, dict) and created["secret"].startswith("sk-llmmesh-")
    revoked = admin_json(capsys, plane, "key", "revoke", created["id"])
    assert isinstance(revoked, dict) and revoked["revoke_time"]
    with pytest.raises(Exception, match="API key revoked"):
        asyncio.run(_authenticate(plane, created["secret"]))


def test_key_list_shows_prefixes_and_states_never_secrets(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess
) -> None:
    assert admin(capsys, plane, "tenant", "create", "listed", "--zone", "us", "--tier", "pro")[0] == 0
    kept = admin_json(capsys, plane, "key", "create", "listed")
    gone = admin_json(capsys, plane, "key", "create", "listed", "--expires-in-days", "3")
    assert isinstance(kept, dict) and isinstance(gone, dict)
    admin_json(capsys, plane, "key", "revoke", gone["id"])
    status, out, _ = admin(capsys, plane, "key", "list", "listed")
    assert status == 0
    header, *rows = out.strip().splitlines()
    assert header.split() == ["KEY", "ID", "PREFIX", "CREATED", "EXPIRES", "STATE"]
    states = {row.split()[0]: row for row in rows}
    assert states[kept["id"]].endswith("active") and "never" in states[kept["id"]]
    assert "revoked" in states[gone["id"]]
    assert kept["secret"] not in out and gone["secret"] not in out
    listed = admin_json(capsys, plane, "key", "list", "listed")
    assert isinstance(listed, list) and {k["id"] for k in listed} == {kept["id"], gone["id"]}
    assert all("secret" not in k for k in listed)


def test_tenant_update_changes_only_what_is_given(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess
) -> None:
    assert (
        admin(capsys, plane, "tenant", "create", "growing", "--zone", "us", "--tier", "free", "--rpm", "5")[0]
        == 0
    )
    updated = admin_json(
        capsys, plane, "tenant", "update", "growing", "--tier", "pro", "--quota", "1000", "--memory"
    )
    assert isinstance(updated, dict)
    assert (updated["tier"], updated["monthly_token_quota"], updated["memory_enabled"]) == (
        "TIER_PRO",
        "1000",
        True,
    )
    assert updated["rpm_limit"] == "5"  # not given: unchanged
    capped = admin_json(
        capsys, plane, "tenant", "update", "growing", "--max-files", "50", "--max-vector-stores", "3"
    )
    assert isinstance(capped, dict)
    assert (capped["max_files"], capped["max_vector_stores"]) == (50, 3)
    assert "max_memories_per_user" not in capped  # not given: unchanged (0, the region's default)
    status, _, err = admin(capsys, plane, "tenant", "update", "growing", "--max-files", "-1")
    assert status == 2 and "max_files must be 0 (the region's default) to" in one_error_line(err)
    status, out, _ = admin(
        capsys, plane, "tenant", "update", "growing", "--no-memory", "--models", "llmmesh-tiny"
    )
    assert status == 0 and "llmmesh-tiny" in out
    status, _, err = admin(capsys, plane, "tenant", "update", "growing")
    assert status == 2 and one_error_line(err).startswith("llmmesh admin: nothing to update")
    status, _, err = admin(capsys, plane, "tenant", "update", "nobody", "--tier", "pro")
    assert status == 2 and "nobody" in one_error_line(err)


def test_bad_key_input_is_rejected(capsys: pytest.CaptureFixture[str], plane: GlobalProcess) -> None:
    status, _, err = admin(capsys, plane, "key", "revoke", "key_missing")
    assert status == 2
    assert one_error_line(err) == "llmmesh admin: no API key 'key_missing' (KEY_NOT_FOUND)"
    status, _, err = admin(capsys, plane, "key", "create", "nobody")
    assert status == 2 and one_error_line(err).endswith("(TENANT_NOT_FOUND)")


async def _bill(plane: GlobalProcess, tenant_id: str) -> None:
    usage = common_pb2.TokenUsage(input_tokens=1000, output_tokens=2000)
    record = bpb.UsageRecord(
        request_id="req-admin-1",
        tenant_id=tenant_id,
        model="llmmesh-tiny",
        usage=usage,
        region="us-east",
        end_user=USER_42,
    )
    record.end_time.FromJsonString("2031-05-17T12:00:00Z")
    # Only a region of the tenant's zone ships its usage.
    async with plane.channel("region-us-east") as channel:
        stub = billing_service_pb2_grpc.BillingServiceStub(channel)
        await stub.RecordUsage(bpb.RecordUsageRequest(records=[record, record]))


def test_usage_shows_exact_cost(capsys: pytest.CaptureFixture[str], plane: GlobalProcess) -> None:
    created = admin_json(capsys, plane, "tenant", "create", "billed", "--zone", "us", "--tier", "pro")
    assert isinstance(created, dict)
    asyncio.run(_bill(plane, created["id"]))
    usage = admin_json(capsys, plane, "usage", "billed", "--period", "2031-05")
    # 1000 * 0.0005 / 1000 + 2000 * 0.0015 / 1000, billed once though delivered twice
    assert usage == {
        "tenant": "billed",
        "period": "2031-05",
        "requests": "1",
        "input_tokens": "1000",
        "output_tokens": "2000",
        "cost_usd": "0.0035",
        # The same split by the model that served the turns and what for.
        "models": [
            {
                "model": "llmmesh-tiny",
                "requests": "1",
                "input_tokens": "1000",
                "output_tokens": "2000",
                "cost_usd": "0.0035",
                "purpose": "USAGE_PURPOSE_TURN",
            }
        ],
    }
    status, out, _ = admin(capsys, plane, "usage", "billed", "--period", "2031-05")
    assert status == 0 and out.splitlines()[1].split() == [
        "2031-05",
        "all",
        "all",
        "1",
        "1000",
        "2000",
        "0.0035",
    ]
    assert out.splitlines()[2].split() == ["2031-05", "llmmesh-tiny", "turn", "1", "1000", "2000", "0.0035"]
    # Billing knows the end user only by pseudonym, which a region of the tenant's zone computes.
    status, out, err = admin(capsys, plane, "usage", "billed", "--period", "2031-05", "--end-user", "user-42")
    assert (status, out) == (1, "")
    line = one_error_line(err)
    assert "no region of zone 'us' is serving" in line and line.endswith("(NO_REGION_IN_ZONE)")


def test_bad_usage_input_is_rejected(capsys: pytest.CaptureFixture[str], plane: GlobalProcess) -> None:
    status, _, err = admin(capsys, plane, "usage", "ghost")
    assert status == 2 and one_error_line(err) == "llmmesh admin: no tenant 'ghost' (TENANT_NOT_FOUND)"
    assert admin(capsys, plane, "tenant", "create", "p", "--zone", "us", "--tier", "free")[0] == 0
    status, _, err = admin(capsys, plane, "usage", "p", "--period", "2031-13")
    assert status == 2 and "period must be 'YYYY-MM'" in one_error_line(err)


def test_a_tenant_in_a_zone_without_regions_is_refused_unless_allowed(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess
) -> None:
    status, out, err = admin(capsys, plane, "tenant", "create", "martian", "--zone", "mars", "--tier", "pro")
    assert (status, out) == (2, "")
    line = one_error_line(err)
    assert "zone 'mars' has no regions: the mesh's zones are eu, us" in line
    assert "--allow-empty-zone" in line and line.endswith("(ZONE_UNKNOWN)")
    assert admin_json(capsys, plane, "tenant", "list", "--zone", "mars") == []
    made = admin_json(
        capsys, plane, "tenant", "create", "martian", "--zone", "mars", "--tier", "pro", "--allow-empty-zone"
    )
    assert isinstance(made, dict) and made["zone"] == "mars"


async def _snapshot(plane: GlobalProcess) -> ppb.PolicySnapshot:
    async with plane.channel("region-us-east") as channel:
        stub = policy_service_pb2_grpc.PolicyServiceStub(channel)
        response: ppb.GetPolicySnapshotResponse = await stub.GetPolicySnapshot(
            ppb.GetPolicySnapshotRequest(zone="us")
        )
        return response.snapshot


def test_tenant_delete_revokes_keys_hides_it_from_snapshots_and_keeps_usage(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess
) -> None:
    made = admin_json(capsys, plane, "tenant", "create", "leaving", "--zone", "us", "--tier", "pro")
    assert isinstance(made, dict)
    key = admin_json(capsys, plane, "key", "create", "leaving")
    assert isinstance(key, dict)
    asyncio.run(_bill(plane, made["id"]))
    # No confirmation, no terminal to ask at: refused, nothing changed.
    status, _, err = admin(capsys, plane, "tenant", "delete", "leaving")
    assert status == 2 and one_error_line(err).endswith("pass --yes to confirm (CONFIRMATION_REQUIRED)")
    assert asyncio.run(_authenticate(plane, key["secret"])).tenant.id == made["id"]

    deleted = admin_json(capsys, plane, "tenant", "delete", "leaving", "--yes")
    assert isinstance(deleted, dict)
    assert (deleted["id"], deleted["revoked_keys"]) == (made["id"], 1) and deleted["delete_time"]
    with pytest.raises(grpc.aio.AioRpcError, match="API key revoked"):
        asyncio.run(_authenticate(plane, key["secret"]))
    snapshot = asyncio.run(_snapshot(plane))
    assert made["id"] in snapshot.deleted_tenant_ids
    assert made["id"] not in {t.id for t in snapshot.tenants}
    assert all(k.revoked for k in snapshot.keys if k.tenant_id == made["id"])
    listed = admin_json(capsys, plane, "tenant", "list", "--zone", "us")
    assert isinstance(listed, list) and "leaving" not in {t["name"] for t in listed}
    # Billing keeps what it billed.
    usage = admin_json(capsys, plane, "usage", "leaving", "--period", "2031-05")
    assert isinstance(usage, dict) and usage["cost_usd"] == "0.0035"
    # Nothing more happens to it, and its name stays taken.
    for argv, needle in (
        (("key", "create", "leaving"), "was deleted at"),
        (("tenant", "update", "leaving", "--rpm", "5"), "was deleted at"),
        (("tenant", "create", "leaving", "--zone", "us", "--tier", "pro"), "a deleted tenant's name stays"),
    ):
        status, _, err = admin(capsys, plane, *argv)
        assert status == 2 and needle in one_error_line(err), err
    again = admin_json(capsys, plane, "tenant", "delete", made["id"], "--yes")
    assert isinstance(again, dict) and (again["revoked_keys"], again["delete_time"]) == (
        0,
        deleted["delete_time"],
    )
    events = admin_json(capsys, plane, "audit")
    assert isinstance(events, list)
    assert any(e["method"] == "DeleteTenant" and e["target"] == made["id"] for e in events)
    status, _, err = admin(capsys, plane, "tenant", "delete", "nobody", "--yes")
    assert status == 2 and one_error_line(err).endswith("(TENANT_NOT_FOUND)")


async def _heartbeat(plane: GlobalProcess) -> None:
    report = gpb.RegionReport(
        region="eu-west",
        zone="eu",
        chat_address="127.0.0.1:1",
        health=common_pb2.HEALTH_STATE_SERVING,
        capacity=64,
        queue_depth=3,
        models=["llmmesh-tiny"],
        engine_pods=2,
        healthy_engine_pods=2,
    )
    async with plane.channel("region-eu-west") as channel:
        stub = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
        await stub.Heartbeat(gpb.HeartbeatRequest(report=report))


def test_regions_table(capsys: pytest.CaptureFixture[str], plane: GlobalProcess) -> None:
    asyncio.run(_heartbeat(plane))
    status, out, _ = admin(capsys, plane, "regions")
    assert status == 0
    header, *rows = out.strip().splitlines()
    assert header.split()[:3] == ["REGION", "ZONE", "HEALTH"]
    row = next(r.split() for r in rows if r.startswith("eu-west"))
    assert row[1:3] == ["eu", "serving"] and row[3].endswith("s")
    assert row[4:] == ["3", "64", "2/2", "llmmesh-tiny"]
    listed = admin_json(capsys, plane, "regions", "--zone", "eu")
    assert isinstance(listed, list) and listed[0]["report"]["region"] == "eu-west"
    assert listed[0]["heartbeat_age_s"] >= 0


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_global_plane_is_one_line(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess
) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    status, out, err = admin(capsys, GlobalProcess(address, plane.certs), "tenant", "list")
    assert (status, out) == (1, "")
    line = one_error_line(err)
    assert line.startswith(f"llmmesh admin: cannot reach the global plane at {address}")
    assert line.endswith("(GLOBAL_PLANE_UNAVAILABLE)")


def test_address_and_certificates_come_from_mesh_json(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMMESH_HOME", str(tmp_path))
    assert main(["admin", "tenant", "list"]) == 2
    assert "pass --global-address" in one_error_line(capsys.readouterr().err)
    mesh = {"global_address": plane.address, "tls": {"insecure": False, "certs_dir": str(plane.certs)}}
    (tmp_path / "mesh.json").write_text(json.dumps(mesh))
    assert main(["admin", "tenant", "list", "--json"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), list)
    # Without a tls entry the certificates are $LLMMESH_HOME/certs', which holds none here.
    (tmp_path / "mesh.json").write_text(json.dumps({"global_address": plane.address}))
    assert main(["admin", "tenant", "list"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"no admin certificate in {tmp_path / 'certs'}" in line
    assert "`llmmesh certs issue admin`" in line and line.endswith("(NO_CERTIFICATE)")


def test_a_missing_certificate_is_one_line_saying_how_to_fix_it(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess, tmp_path: Path
) -> None:
    status, out, err = admin_as(capsys, plane.address, "tenant", "list", "--certs-dir", str(tmp_path))
    assert (status, out) == (2, "")
    line = one_error_line(err)
    assert (
        f"(admin.pem, admin.key, ca.pem missing): issue one with `llmmesh certs issue admin --dir {tmp_path}`"
        in line
    )
    assert "or pass --insecure" in line and line.endswith("(NO_CERTIFICATE)")


def test_plaintext_to_an_mtls_plane_is_one_line(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess
) -> None:
    status, out, err = admin_as(capsys, plane.address, "tenant", "list", "--insecure")
    assert (status, out) == (1, "")
    line = one_error_line(err)
    assert "(plaintext, as --insecure asks: does the mesh run mTLS?)" in line
    assert line.endswith("(GLOBAL_PLANE_UNAVAILABLE)")


def test_only_an_admin_certificate_may_administer(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess, tmp_path: Path
) -> None:
    # The client certificate, presented where the tool looks for the admin one.
    for suffix in ("pem", "key"):
        shutil.copy(plane.certs / f"client.{suffix}", tmp_path / f"admin.{suffix}")
    shutil.copy(plane.certs / "ca.pem", tmp_path / "ca.pem")
    status, out, err = admin_as(capsys, plane.address, "tenant", "list", "--certs-dir", str(tmp_path))
    assert (status, out) == (1, "")
    line = one_error_line(err)
    assert "client client may not call ListTenants" in line and line.endswith("(PEER_NOT_ALLOWED)")


def test_audit_lists_every_admin_change_page_by_page(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = admin_json(capsys, plane, "tenant", "create", "audited", "--zone", "eu", "--tier", "free")
    created = admin_json(capsys, plane, "key", "create", "audited")
    assert isinstance(made, dict) and isinstance(created, dict)
    # Pages of two: the whole log comes back however many pages it takes.
    monkeypatch.setattr(admin_cli, "AUDIT_PAGE_SIZE", 2)
    events = admin_json(capsys, plane, "audit")
    assert isinstance(events, list) and len(events) >= 3
    ids = [int(e["id"]) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    tenant = next(e for e in events if e["method"] == "CreateTenant" and e["target"] == made["id"])
    key = next(e for e in events if e["method"] == "CreateApiKey" and e["target"] == created["id"])
    assert tenant["actor"] == key["actor"] == ADMIN_URI
    assert tenant["request"]["tenant"]["name"] == "audited"
    assert created["secret"] not in json.dumps(events)
    status, out, _ = admin(capsys, plane, "audit")
    assert status == 0
    header, *rows = out.strip().splitlines()
    assert header.split() == ["ID", "TIME", "ACTOR", "METHOD", "TARGET"]
    assert any(r.split()[3:] == [ADMIN_URI, "CreateTenant", made["id"]] for r in rows)


def test_region_remove_takes_a_region_out_of_the_directory(
    capsys: pytest.CaptureFixture[str], plane: GlobalProcess
) -> None:
    asyncio.run(_heartbeat(plane))
    status, out, _ = admin(capsys, plane, "region", "remove", "eu-west")
    assert (status, out.strip()) == (0, "removed region eu-west (zone eu, 127.0.0.1:1)")
    listed = admin_json(capsys, plane, "regions")
    assert isinstance(listed, list) and "eu-west" not in [s["report"]["region"] for s in listed]
    audited = admin_json(capsys, plane, "audit")
    assert isinstance(audited, list) and audited[-1]["method"] == "RemoveRegion"
    assert audited[-1]["target"] == "eu-west" and audited[-1]["actor"].endswith("/admin")
    status, _, err = admin(capsys, plane, "region", "remove", "eu-west")
    assert status == 2 and one_error_line(err).endswith("(REGION_NOT_FOUND)")

    # Only an operator may remove a region: not the region itself.
    async def as_region() -> grpc.StatusCode:
        async with plane.channel("region-eu-west") as channel:
            stub = geo_routing_service_pb2_grpc.GeoRoutingServiceStub(channel)
            try:
                await stub.RemoveRegion(gpb.RemoveRegionRequest(region="eu-west"))
            except grpc.aio.AioRpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    assert asyncio.run(as_region()) == grpc.StatusCode.PERMISSION_DENIED

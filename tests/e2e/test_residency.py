"""Residency, proved on the running mesh: an ``eu`` tenant's turns, stateless
and in a conversation, are processed only by ``eu`` regions (every region's
request log, the usage outbox of every zone store, says who ran each turn;
the ``us`` pods' counters do not move) and its conversation is stored only
in the ``eu`` store; billing hears of them from ``eu`` regions only. When no
region of ``eu`` serves, its requests fail with a 403 at the edge and never
reach ``us``."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa

from llmmesh.core.sqlstore import create_store_engine
from tests.e2e.conftest import (
    NO_TENANT_ROWS,
    RunningMesh,
    pod_counters,
    served_requests,
    start_up,
    stop_up,
    tenant_rows,
)

pytestmark = pytest.mark.e2e

POLL_S = 0.1
WAIT_S = 30.0


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def sse_payloads(text: str) -> list[dict[str, object]]:
    """The JSON events of an SSE body, after checking it ends with one ``[DONE]``."""
    events = [e for e in text.split("\n\n") if e.strip()]
    assert events[-1].endswith("data: [DONE]") and text.count("[DONE]") == 1
    return [json.loads(e.split("data: ", 1)[1]) for e in events[:-1]]


def eventually_served(mesh: RunningMesh, zone: str, request_ids: set[str]) -> dict[str, set[str]]:
    """The zone store's request log once it holds every one of ``request_ids`` (bounded wait)."""
    deadline = time.monotonic() + WAIT_S
    for _ in range(int(WAIT_S / POLL_S)):
        served = served_requests(mesh.store_url(zone))
        if request_ids <= set().union(*served.values()) or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    return served


def billed_regions(mesh: RunningMesh, request_ids: set[str]) -> dict[str, str]:
    """The region billing recorded for each of ``request_ids`` it has received."""
    engine = create_store_engine(f"sqlite:///{mesh.home / 'global.db'}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT request_id, region FROM usage_records")).all()
    finally:
        engine.dispose()
    return {request_id: region for request_id, region in rows if request_id in request_ids}


def us_footprint(mesh: RunningMesh) -> tuple[dict[str, set[str]], tuple[float, float]]:
    """What the us zone has seen: its request log and its pods' counters."""
    return served_requests(mesh.store_url("us")), pod_counters(mesh.pod_metrics_urls("us"))


def test_eu_stateless_turns_run_only_in_eu_regions(mesh: RunningMesh) -> None:
    eu_regions = mesh.regions_in("eu")
    before = us_footprint(mesh)
    ran: dict[str, str] = {}
    with httpx.Client(base_url=mesh.edge_url, headers=auth(mesh.key("eu")), timeout=60) as http:
        for n in range(6):
            body = {
                "model": "auto",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": f"Bonjour {n}"}],
            }
            if n % 2:
                resp = http.post("/v1/chat/completions", json={**body, "stream": True})
                assert resp.status_code == 200, resp.text
                request_id = str(sse_payloads(resp.text)[0]["id"])
            else:
                resp = http.post("/v1/chat/completions", json=body)
                assert resp.status_code == 200, resp.text
                request_id = resp.json()["id"]
            ran[request_id] = resp.headers["x-llmmesh-region"]
    assert set(ran.values()) <= eu_regions

    # Every region's request log: each turn is in the eu store, under the region that ran it.
    served = eventually_served(mesh, "eu", set(ran))
    for request_id, region in ran.items():
        assert request_id in served.get(region, set()), (request_id, region, served)
    assert set(served) <= eu_regions
    # The us zone saw none of it: no turn in its log, no prompt at its pods.
    assert us_footprint(mesh) == before
    assert tenant_rows(mesh.store_url("us"), mesh.tenant_id("eu")) == NO_TENANT_ROWS
    # Billing (global metadata only) heard of each turn from the eu region that ran it.
    deadline = time.monotonic() + WAIT_S
    for _ in range(int(WAIT_S / POLL_S)):
        if billed_regions(mesh, set(ran)) == ran or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    assert billed_regions(mesh, set(ran)) == ran


def test_eu_conversation_is_processed_and_stored_only_in_eu(mesh: RunningMesh) -> None:
    eu_regions = mesh.regions_in("eu")
    before = us_footprint(mesh)
    with httpx.Client(base_url=mesh.edge_url, headers=auth(mesh.key("eu")), timeout=60) as http:
        created = http.post("/v1/conversations", json={"title": "Residency"})
        assert created.status_code == 200, created.text
        conversation = created.json()
        cid = conversation["id"]
        assert conversation["zone"] == "eu" and conversation["home_region"] in eu_regions
        assert cid.startswith(f"conv_eu_{conversation['home_region']}_")
        first = http.post(
            f"/v1/conversations/{cid}/messages", json={"content": "Wo ist mein Fahrrad?", "stream": True}
        )
        assert first.status_code == 200, first.text
        second = http.post(
            f"/v1/conversations/{cid}/messages", json={"content": "Und jetzt?", "max_tokens": 8}
        )
        assert second.status_code == 200, second.text
    turns = {str(sse_payloads(first.text)[0]["id"]): first, second.json()["id"]: second}
    assert {r.headers["x-llmmesh-region"] for r in turns.values()} <= eu_regions

    rows = tenant_rows(mesh.store_url("eu"), mesh.tenant_id("eu"))
    assert [c["id"] for c in rows["conversations"] if c["id"] == cid] == [cid]
    messages = [m for m in rows["messages"] if m["conversation_id"] == cid]
    assert [m["role"] for m in sorted(messages, key=lambda m: int(str(m["seq"])))] == [
        "user",
        "assistant",
    ] * 2
    assert {m["home_region"] for m in messages} == {conversation["home_region"]}
    served = eventually_served(mesh, "eu", set(turns))
    for request_id, resp in turns.items():
        assert request_id in served.get(resp.headers["x-llmmesh-region"], set())

    # Not a row of it in the us store, and the us zone processed nothing.
    assert tenant_rows(mesh.store_url("us"), mesh.tenant_id("eu")) == NO_TENANT_ROWS
    engine = create_store_engine(mesh.store_url("us"))
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT count(*) FROM messages WHERE conversation_id = :c"), {"c": cid}
            )
            assert found.scalar_one() == 0
    finally:
        engine.dispose()
    assert us_footprint(mesh) == before
    # The us tenant cannot reach it either: to it, the id does not exist.
    other = httpx.get(f"{mesh.edge_url}/v1/conversations/{cid}", headers=auth(mesh.key("us")), timeout=30)
    assert other.status_code == 404


# ------------------------------------------------- a zone with no serving region


@pytest.fixture(scope="module")
def small_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningMesh]:
    """A mesh of its own (us-east; eu-west and eu-central), whose eu regions a test stops."""
    home = tmp_path_factory.mktemp("llmmesh-residency")
    config = home / "mesh.toml"
    config.write_text(
        "[mesh]\nedge_port = 0\n"
        "[zones.us.regions.us-east]\n[zones.eu.regions.eu-west]\n[zones.eu.regions.eu-central]\n"
    )
    # Stopped regions stay down: llmmesh up would restart them.
    running = start_up(
        home, "--config", str(config), "--dev-key", "sk-llmmesh-residency", "--restart", "never"
    )
    yield running
    if running.process.poll() is None:
        stop_up(running)


def refusals_until_403(mesh: RunningMesh, key: str) -> tuple[list[int], httpx.Response]:
    """Statuses of eu turns sent until one is refused with 403 (bounded), and that refusal."""
    statuses: list[int] = []
    body = {"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "Anyone?"}]}
    deadline = time.monotonic() + WAIT_S
    with httpx.Client(base_url=mesh.edge_url, headers=auth(key), timeout=30) as http:
        for _ in range(int(WAIT_S / POLL_S)):
            resp = http.post("/v1/chat/completions", json=body)
            statuses.append(resp.status_code)
            if resp.status_code == 403 or time.monotonic() > deadline:
                return statuses, resp
            time.sleep(POLL_S)
    return statuses, resp


def test_no_serving_eu_region_is_a_403_that_never_reaches_us(small_mesh: RunningMesh) -> None:
    mesh = small_mesh
    warm = httpx.post(
        f"{mesh.edge_url}/v1/chat/completions",
        json={"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "Hallo"}]},
        headers=auth(mesh.key("eu")),
        timeout=60,
    )
    assert warm.status_code == 200 and warm.headers["x-llmmesh-region"] in {"eu-west", "eu-central"}
    before = us_footprint(mesh)

    for region in ("eu-west", "eu-central"):
        os.kill(mesh.pids[region], signal.SIGKILL)
    statuses, refused = refusals_until_403(mesh, mesh.key("eu"))
    assert refused.status_code == 403, statuses
    # Until geo-routing notices, the edge finds the dead regions unreachable; never does a turn succeed.
    assert set(statuses[:-1]) <= {503}, statuses
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("permission_error", "no_region_in_zone")
    assert "zone 'eu'" in error["message"]
    created = httpx.post(
        f"{mesh.edge_url}/v1/conversations", json={}, headers=auth(mesh.key("eu")), timeout=30
    )
    assert created.status_code == 403 and created.json()["error"]["code"] == "no_region_in_zone"

    # Nothing of it reached us: not its store, not its pods.
    assert us_footprint(mesh) == before
    assert tenant_rows(mesh.store_url("us"), mesh.tenant_id("eu")) == NO_TENANT_ROWS
    # The us zone still serves, and llmmesh up reported the exits and goes on.
    us = httpx.post(
        f"{mesh.edge_url}/v1/chat/completions",
        json={"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
        headers=auth(mesh.key("us")),
        timeout=60,
    )
    assert us.status_code == 200 and us.headers["x-llmmesh-region"] == "us-east"
    assert mesh.process.poll() is None
    log = mesh.log()
    for region in ("eu-west", "eu-central"):
        assert f"region {region} (pid {mesh.pids[region]}) exited with status -9" in log
    status, out = stop_up(mesh)
    assert status == 0, out


# ------------------------------------------------- branches and summaries


def test_eu_branches_and_summaries_are_stored_only_in_eu(mesh: RunningMesh) -> None:
    eu_regions = mesh.regions_in("eu")
    before = us_footprint(mesh)
    # Long enough that a few turns outgrow the model's window, so the thread is summarised.
    long = "It is one of the words that you can say when they are out with all of us. " * 70
    with httpx.Client(base_url=mesh.edge_url, headers=auth(mesh.key("eu")), timeout=120) as http:
        cid = http.post("/v1/conversations", json={"title": "Zweige"}).json()["id"]
        for n in range(4):
            sent = http.post(
                f"/v1/conversations/{cid}/messages", json={"content": f"{n}: {long}", "max_tokens": 4}
            )
            assert sent.status_code == 200, sent.text
        listed = http.get(f"/v1/conversations/{cid}/messages").json()["data"]
        question, answer = listed[-2], listed[-1]
        regenerated = http.post(
            f"/v1/conversations/{cid}/messages/{answer['id']}/regenerate", json={"max_tokens": 4}
        )
        assert regenerated.status_code == 200, regenerated.text
        edited = http.post(
            f"/v1/conversations/{cid}/messages",
            json={"content": "And to the sea?", "edit_id": question["id"], "max_tokens": 4},
        )
        assert edited.status_code == 200, edited.text
        branches = http.get(f"/v1/conversations/{cid}/branches").json()["data"]
        assert len(branches) == 3 and sum(b["current"] for b in branches) == 1
    assert {r.headers["x-llmmesh-region"] for r in (regenerated, edited)} <= eu_regions

    home = cid.split("_")[2]
    deadline = time.monotonic() + WAIT_S
    rows = tenant_rows(mesh.store_url("eu"), mesh.tenant_id("eu"))
    for _ in range(int(WAIT_S / POLL_S)):
        rows = tenant_rows(mesh.store_url("eu"), mesh.tenant_id("eu"))
        if (
            any(s["conversation_id"] == cid for s in rows["conversation_summaries"])
            or time.monotonic() > deadline
        ):
            break
        time.sleep(POLL_S)
    summaries = [s for s in rows["conversation_summaries"] if s["conversation_id"] == cid]
    assert summaries and {s["home_region"] for s in summaries} == {home}
    messages = [m for m in rows["messages"] if m["conversation_id"] == cid]
    # Four turns, a regenerated reply and an edited question with its reply, each under its parent.
    assert len(messages) == 11 and {m["home_region"] for m in messages} == {home}
    assert len({m["parent_id"] for m in messages}) == 9
    # Nothing of it in the us store, and the us zone processed nothing.
    assert tenant_rows(mesh.store_url("us"), mesh.tenant_id("eu")) == NO_TENANT_ROWS
    assert us_footprint(mesh) == before

"""Residency, proved on the running mesh: an ``eu`` tenant's turns, stateless
and in a conversation, are processed only by ``eu`` regions (every region's
request log, the usage outbox of every zone store, says who ran each turn;
the ``us`` pods' counters do not move) and its conversation is stored only
in the ``eu`` store; billing hears of them from ``eu`` regions only. When no
region of ``eu`` serves, its requests fail with a 403 at the edge and never
reach ``us``. An eu end user's id ("zed") leaves the zone only as its
pseudonym: no row of the global store holds it, and ``llmmesh admin usage
--end-user zed`` finds its turns through a region of eu. Each zone has a
Redis of its own: an eu stream's log (its reply text) is in eu's Redis and
nowhere in us's, and the other way round; and no plane logs the prompt, the
reply or the end user of a turn. The shared mesh exports every span to the
tests' OTLP sink: no span of a plane outside eu (the edge, the global plane,
us regions and pods) holds an eu turn's prompt, reply or end user."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import sqlalchemy as sa

from llmmesh.cli.main import main
from llmmesh.core.end_user import is_end_user_pseudonym
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
from tests.e2e.span_sink import ExportedSpan, SpanSink

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


def raw_in_global_store(mesh: RunningMesh, text: str) -> list[str]:
    """Every value of every row of every table of the global store that holds ``text``
    (pseudonyms aside: their base32 may spell anything)."""
    engine = create_store_engine(f"sqlite:///{mesh.home / 'global.db'}")
    found: list[str] = []
    try:
        with engine.connect() as conn:
            for table in sa.inspect(conn).get_table_names():
                for row in conn.execute(sa.text(f'SELECT * FROM "{table}"')):
                    for value in row:
                        cell = bytes(value).decode("latin-1") if isinstance(value, bytes) else str(value)
                        if text in cell.lower() and not is_end_user_pseudonym(cell):
                            found.append(f"{table}: {cell}")
    finally:
        engine.dispose()
    return found


def us_footprint(mesh: RunningMesh) -> tuple[dict[str, set[str]], tuple[float, float]]:
    """What the us zone has seen: its request log and its pods' counters."""
    return served_requests(mesh.store_url("us")), pod_counters(mesh.pod_metrics_urls("us"))


def test_eu_stateless_turns_run_only_in_eu_regions(
    mesh: RunningMesh, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    eu_regions = mesh.regions_in("eu")
    before = us_footprint(mesh)
    ran: dict[str, str] = {}
    with httpx.Client(base_url=mesh.edge_url, headers=auth(mesh.key("eu")), timeout=60) as http:
        for n in range(6):
            body = {
                "model": "auto",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": f"Bonjour {n}"}],
                "user": "zed",
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
    # The end user reached billing only as its pseudonym, which the operator's CLI asks eu for.
    assert raw_in_global_store(mesh, "zed") == []
    monkeypatch.setenv("LLMMESH_HOME", str(mesh.home))
    capsys.readouterr()
    status = main(["admin", "usage", mesh.tenant_id("eu"), "--end-user", "zed", "--json"])
    out, err = capsys.readouterr()
    assert status == 0, err
    answer = json.loads(out)
    assert is_end_user_pseudonym(answer["end_user_pseudonym"]) and answer["requests"] == str(len(ran))


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


# ------------------------------------------------- each zone's Redis, and the logs


def redis_contents(url: str) -> list[bytes]:
    """Every key of the Redis at ``url`` and every value it holds, whatever its type."""
    client = redis.Redis.from_url(url)
    # Each type's read, as a command whose reply flattens to the values.
    reads = {
        b"string": ("GET",),
        b"hash": ("HGETALL",),
        b"list": ("LRANGE", 0, -1),
        b"set": ("SMEMBERS",),
        b"zset": ("ZRANGE", 0, -1),
        b"stream": ("XRANGE", "-", "+"),
    }
    found: list[bytes] = []

    def flatten(reply: Any) -> None:
        if isinstance(reply, bytes):
            found.append(reply)
        elif isinstance(reply, dict):
            for pair in reply.items():
                flatten(list(pair))
        elif isinstance(reply, (list, tuple, set)):
            for item in reply:
                flatten(item)

    try:
        for key in client.scan_iter(count=1000):
            found.append(key)
            kind: Any = client.type(key)
            command, *args = reads[kind]
            flatten(client.execute_command(command, key, *args))  # type: ignore[no-untyped-call]
    finally:
        client.close()
    return found


def replies_in(contents: list[bytes]) -> dict[str, str]:
    """The reply text of each stream whose SSE events ``contents`` hold, by completion id."""
    replies: dict[str, str] = {}
    for value in contents:
        if not value.startswith(b"data: {"):
            continue
        event = json.loads(value[len(b"data: ") :])
        for choice in event.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") or ""
            replies[event["id"]] = replies.get(event["id"], "") + text
    return replies


def streamed_turn(mesh: RunningMesh, zone: str, prompt: str, user: str) -> tuple[str, str]:
    """A streamed turn of ``zone``'s tenant, run in a region of ``zone``: its completion id and reply text."""
    body = {
        "model": "auto",
        "max_tokens": 16,
        "stream": True,
        "messages": [{"role": "user", "content": prompt}],
        "user": user,
    }
    resp = httpx.post(
        f"{mesh.edge_url}/v1/chat/completions", json=body, headers=auth(mesh.key(zone)), timeout=60
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-llmmesh-region"] in mesh.regions_in(zone)
    completion_id = str(sse_payloads(resp.text)[0]["id"])
    frames = [line.encode() for line in resp.text.splitlines() if line.startswith("data: {")]
    return completion_id, replies_in(frames)[completion_id]


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_each_zones_stream_logs_stay_in_its_own_redis_and_no_plane_logs_content(
    mesh: RunningMesh,
) -> None:
    urls = mesh.info["redis_urls"]
    assert isinstance(urls, dict) and urls["eu"] != urls["us"]
    tag = secrets.token_hex(4)
    turns = {
        "eu": streamed_turn(mesh, "eu", f"Wo steht das Fahrrad {tag}?", f"zed-{tag}"),
        "us": streamed_turn(mesh, "us", f"Where is the bicycle {tag}?", f"yan-{tag}"),
    }
    users = {"eu": f"zed-{tag}", "us": f"yan-{tag}"}
    assert turns["eu"][1] and turns["us"][1] and turns["eu"][1] != turns["us"][1]
    contents = {zone: redis_contents(str(url)) for zone, url in urls.items()}
    for zone, other in (("eu", "us"), ("us", "eu")):
        (own_id, own_reply), (other_id, other_reply) = turns[zone], turns[other]
        # The zone's stream log holds its stream, whole, in its own Redis ...
        assert replies_in(contents[zone]).get(own_id) == own_reply
        # ... and not a byte of it is in the other zone's: not its id, reply, tenant or end user.
        held = replies_in(contents[other])
        assert own_id not in held and own_reply not in held.values()
        markers = [own_id, own_reply, mesh.tenant_id(zone), users[zone]]
        leaked = [m for m in markers for value in contents[other] if m.encode() in value]
        assert leaked == [], (zone, other)
        assert other_id in held and other_reply in held.values()
    # The planes' logs (llmmesh up gathers every plane's): no prompt or reply of either turn, and an
    # end user named only in its turn's record, which the region that ran it, of its zone, writes.
    lines = mesh.log().splitlines()
    for zone, (completion_id, reply) in turns.items():
        assert [line for line in lines if reply in line or f"{tag}?" in line] == []
        naming = [line for line in lines if users[zone] in line]
        assert all(f"[region] INFO llmmesh.region.turn.record: turn {completion_id}:" in n for n in naming)


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


# ------------------------------------------------- the exported spans


def eu_turns_spans(span_sink: SpanSink, request_ids: set[str]) -> list[ExportedSpan]:
    """Every span exported so far, once each of ``request_ids`` has its edge's and its
    region's span, and a pod's in its trace, among them (bounded wait: the planes export
    in batches)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        spans = span_sink.spans()
        traces = {
            span.attribute("llmmesh.request_id"): span.span.trace_id
            for span in spans
            if span.service == "llmmesh-region" and span.attribute("llmmesh.request_id") in request_ids
        }
        edge = {span.attribute("llmmesh.request_id") for span in spans if span.service == "llmmesh-edge"}
        generated = {span.span.trace_id for span in spans if span.service == "llmmesh-engine"}
        done = {r for r, trace_id in traces.items() if r in edge and trace_id in generated}
        if done == request_ids or time.monotonic() > deadline:
            assert done == request_ids, request_ids - done
            return spans
        time.sleep(POLL_S)


def test_no_span_outside_eu_holds_an_eu_turns_content_or_end_user(
    mesh: RunningMesh, span_sink: SpanSink
) -> None:
    tag = secrets.token_hex(4)
    user = f"zed-{tag}"
    prompts = [f"Wo steht das Rad {tag}?", f"Wie spät ist es {tag}?", f"Wohin fährt der Zug {tag}?"]
    streamed_id, streamed_reply = streamed_turn(mesh, "eu", prompts[0], user)
    with httpx.Client(base_url=mesh.edge_url, headers=auth(mesh.key("eu")), timeout=60) as http:
        body = {"model": "auto", "max_tokens": 16, "messages": [{"role": "user", "content": prompts[1]}]}
        plain = http.post("/v1/chat/completions", json={**body, "user": user})
        assert plain.status_code == 200, plain.text
        cid = http.post("/v1/conversations", json={"title": f"Spuren {tag}"}).json()["id"]
        sent = http.post(f"/v1/conversations/{cid}/messages", json={"content": prompts[2], "max_tokens": 16})
        assert sent.status_code == 200, sent.text
    replies = [streamed_reply, plain.json()["choices"][0]["message"]["content"]]
    replies.append(sent.json()["choices"][0]["message"]["content"])
    assert all(len(reply) >= 8 for reply in replies), replies
    turns = {streamed_id, plain.json()["id"], sent.json()["id"]}

    spans = eu_turns_spans(span_sink, turns)
    # Each span's resource says which plane made it, and a zone-bound plane's its zone and region.
    services = {span.service for span in spans}
    assert {"llmmesh-edge", "llmmesh-region", "llmmesh-engine", "llmmesh-global"} <= services, services
    for span in spans:
        if span.service in ("llmmesh-region", "llmmesh-engine"):
            assert span.region in mesh.zone_of() and mesh.zone_of()[span.region] == span.zone, span.resource
        else:
            assert (span.zone, span.region) == ("", ""), span.resource
    traces = {span.span.trace_id for span in spans if span.attribute("llmmesh.request_id") in turns}
    served = {(span.service, span.zone) for span in spans if span.span.trace_id in traces and span.zone}
    assert served == {("llmmesh-region", "eu"), ("llmmesh-engine", "eu")}, served
    # The tag is in every prompt, the title and the end user's id: outside eu, not in any span.
    markers = [tag, user, *prompts, *replies]
    leaked = [
        (span.service, span.region, span.span.name, text)
        for span in spans
        if span.zone != "eu"
        for text in span.texts()
        if any(marker in text for marker in markers)
    ]
    assert leaked == []

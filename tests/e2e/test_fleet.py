"""A model fleet end to end: one mesh (every plane in this process, the
simulator's pods) serving llmmesh-small and llmmesh-large, registered
through ``llmmesh admin model``. ``auto`` sends chit-chat to the small model
and a long code and maths prompt to the large one, says why in
``x-llmmesh-route-*`` headers, falls back inside the zone when a model's
pods are down, and billing prices each model's turns at its own prices
(``llmmesh admin usage`` shows the split)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal

import httpx
import pytest
import pytest_asyncio

from llmmesh.core.model_family import LARGE, SMALL, FamilyModel
from llmmesh.edge.server import EdgeServer
from llmmesh.engine.server import EnginePod
from llmmesh.globalplane.server import GlobalPlane
from llmmesh.region.server import RegionPlane
from tests.stack import DEV_KEY, MeshBuilder, region_settings, wait_until

CHIT_CHAT = "Hi there! How are you today?"
HARD = (
    "Implement a Python function that solves the matrix equation A x = b and prove that "
    "your algorithm converges; explain why step by step.\n```python\ndef solve(a, b):\n    return None\n```\n"
    + "The matrix is 3 x 3 and every entry is 2 * 3 + 1 = 7 except the diagonal. "
    * 40
)


@dataclass
class Fleet:
    glob: GlobalPlane
    pods: dict[str, EnginePod]
    region: RegionPlane
    edge: EdgeServer


async def admin(glob: GlobalPlane, *args: str) -> dict[str, object] | list[object]:
    """``llmmesh admin ARGS --json`` against the global plane, as an operator runs it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmmesh",
        "admin",
        *args,
        "--global-address",
        glob.address,
        "--insecure",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    answer: dict[str, object] | list[object] = json.loads(out)
    return answer


async def register(glob: GlobalPlane, model: FamilyModel) -> None:
    await admin(
        glob,
        "model",
        "register",
        model.name,
        "--tier",
        model.tier,
        "--input-price",
        model.input_per_1k_usd,
        "--output-price",
        model.output_per_1k_usd,
    )


async def start_pod(build: MeshBuilder, model: FamilyModel, n: int) -> EnginePod:
    timing = model.sim_timing()
    return await build.pod(
        f"us-east-pod-{n}",
        model=model.name,
        sim_inter_token_s=timing["sim_inter_token_s"],
        sim_prefill_per_token_s=timing["sim_prefill_per_token_s"],
        # One generation at a time: a second turn on the model queues behind it.
        max_num_seqs=1,
    )


@pytest_asyncio.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async with MeshBuilder() as build:
        glob = await build.global_plane()
        for model in (SMALL, LARGE):
            await register(glob, model)
        pods = {SMALL.name: await start_pod(build, SMALL, 0), LARGE.name: await start_pod(build, LARGE, 1)}
        # A model is overloaded as soon as its one pod has a turn in flight.
        settings = region_settings(glob.address, list(pods.values()), fallback_queue_factor=1.0)
        region = await build.region(settings)
        await wait_until(lambda: len(region.pool.models) == 2 and len(region.pool.healthy_pods) == 2)
        edge = await build.edge(glob.address)
        yield Fleet(glob, pods, region, edge)


async def ask(fleet: Fleet, text: str, *, stream: bool = False, model: str = "auto") -> httpx.Response:
    async with httpx.AsyncClient(base_url=fleet.edge.url, timeout=60) as client:
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8}
        if stream:
            body["stream"] = True
        return await client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {DEV_KEY}"}
        )


@pytest.mark.asyncio
async def test_auto_routes_by_difficulty_and_bills_each_model(fleet: Fleet) -> None:
    easy = await ask(fleet, CHIT_CHAT)
    assert easy.status_code == 200, easy.text
    assert easy.headers["x-llmmesh-route-reason"] == "difficulty"
    assert easy.headers["x-llmmesh-route-model"] == SMALL.name
    hard = await ask(fleet, HARD, stream=True)
    assert hard.status_code == 200, hard.text
    assert hard.headers["x-llmmesh-route-reason"] == "difficulty"
    assert hard.headers["x-llmmesh-route-model"] == LARGE.name
    assert "code" in hard.headers["x-llmmesh-route-detail"]
    assert "maths" in hard.headers["x-llmmesh-route-detail"]
    assert hard.text.rstrip().endswith("data: [DONE]")

    # Billing: each model's turn at that model's prices, split by model.
    async def billed() -> dict[str, dict[str, object]]:
        usage = await admin(fleet.glob, "usage", "dev")
        assert isinstance(usage, dict)
        return {str(m["model"]): m for m in usage.get("models", [])}  # type: ignore[attr-defined]

    by_model: dict[str, dict[str, object]] = {}
    for _ in range(100):
        by_model = await billed()
        if set(by_model) == {SMALL.name, LARGE.name}:
            break
        await asyncio.sleep(0.2)
    assert set(by_model) == {SMALL.name, LARGE.name}
    for member in (SMALL, LARGE):
        row = by_model[member.name]
        inputs, outputs = int(str(row.get("input_tokens", 0))), int(str(row.get("output_tokens", 0)))
        expected = (
            Decimal(inputs) * Decimal(member.input_per_1k_usd)
            + Decimal(outputs) * Decimal(member.output_per_1k_usd)
        ) / 1000
        assert Decimal(str(row["cost_usd"])) == expected
        assert row["requests"] in (1, "1")


@pytest.mark.asyncio
async def test_a_down_model_falls_back_inside_the_zone(fleet: Fleet) -> None:
    await fleet.pods[LARGE.name].stop(0.5)
    await wait_until(lambda: len(fleet.region.pool.healthy_pods) == 1, what="the region sees the pod down")
    hard = await ask(fleet, HARD)
    assert hard.status_code == 200, hard.text
    assert hard.headers["x-llmmesh-route-reason"] == "fallback"
    assert hard.headers["x-llmmesh-route-model"] == SMALL.name
    assert hard.headers["x-llmmesh-region"] == "us-east"
    # A named model does not fall back unless its tenant's tier allows it.
    named = await ask(fleet, HARD, model=LARGE.name)
    assert named.status_code == 503, named.text


@pytest.mark.asyncio
async def test_an_overloaded_model_falls_back_inside_the_zone(fleet: Fleet) -> None:
    large = next(p for p in fleet.region.pool.pods if p.model == LARGE.name)
    async with httpx.AsyncClient(base_url=fleet.edge.url, timeout=60) as client:
        body = {
            "model": "auto",
            "messages": [{"role": "user", "content": HARD}],
            "max_tokens": 400,
            "stream": True,
        }
        headers = {"authorization": f"Bearer {DEV_KEY}"}
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as busy:
            assert busy.headers["x-llmmesh-route-model"] == LARGE.name
            await wait_until(lambda: large.in_flight >= 1, what="the large model's pod is busy")
            spill = await ask(fleet, HARD)
            assert spill.status_code == 200, spill.text
            assert spill.headers["x-llmmesh-route-reason"] == "fallback"
            assert spill.headers["x-llmmesh-route-model"] == SMALL.name
            assert "overloaded" in spill.headers["x-llmmesh-route-detail"]
            await busy.aclose()


@pytest.mark.asyncio
async def test_a_conversation_turn_on_auto_is_routed_by_its_depth_too(fleet: Fleet) -> None:
    headers = {"authorization": f"Bearer {DEV_KEY}"}
    async with httpx.AsyncClient(base_url=fleet.edge.url, timeout=60) as client:
        created = await client.post("/v1/conversations", json={"model": "auto"}, headers=headers)
        assert created.status_code in (200, 201), created.text
        path = f"/v1/conversations/{created.json()['id']}/messages"
        route = []
        for n in range(9):
            body = {"content": f"Nice, tell me more about your day, part {chr(97 + n)}.", "max_tokens": 4}
            turn = await client.post(path, json=body, headers=headers)
            assert turn.status_code == 200, turn.text
            route.append((turn.headers["x-llmmesh-route-reason"], turn.headers["x-llmmesh-route-model"]))
        assert route[0] == ("difficulty", SMALL.name)
        # Eight turns deep the conversation itself counts; chit-chat stays on the small model.
        assert "deep conversation" in turn.headers["x-llmmesh-route-detail"]


@pytest.mark.asyncio
async def test_a_retired_model_is_neither_listed_nor_served(fleet: Fleet) -> None:
    # The global plane's default model is in the registry, but no pod here serves it.
    async with httpx.AsyncClient(base_url=fleet.edge.url, timeout=60) as client:
        headers = {"authorization": f"Bearer {DEV_KEY}"}
        listed = {m["id"] for m in (await client.get("/v1/models", headers=headers)).json()["data"]}
        assert {SMALL.name, LARGE.name} <= listed and "llmmesh-tiny" not in listed
    unserved = await ask(fleet, CHIT_CHAT, model="llmmesh-tiny")
    error = unserved.json()["error"]
    assert unserved.status_code == 404 and (error["code"], error["param"]) == ("model_not_found", "model")
    assert "not served in zone 'us'" in error["message"] and LARGE.name in error["message"]
    await admin(fleet.glob, "model", "retire", LARGE.name)
    async with httpx.AsyncClient(base_url=fleet.edge.url, timeout=60) as client:
        headers = {"authorization": f"Bearer {DEV_KEY}"}
        listed = (await client.get("/v1/models", headers=headers)).json()["data"]
        assert LARGE.name not in {m["id"] for m in listed} and SMALL.name in {m["id"] for m in listed}
        one = await client.get(f"/v1/models/{LARGE.name}", headers=headers)
        assert one.status_code == 404 and one.json()["error"]["code"] == "model_not_found"
    named = await ask(fleet, CHIT_CHAT, model=LARGE.name)
    assert named.status_code == 400 and named.json()["error"]["code"] == "model_retired"

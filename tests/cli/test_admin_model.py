"""``llmmesh admin model`` against a real global plane (in this process,
plaintext): list, register, price, retire and weight, each an audited
UpsertModel; bad input is one line and exit status 2."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from llmmesh.globalplane.server import GlobalPlane, start_global_plane
from llmmesh.globalplane.settings import GlobalSettings


@pytest_asyncio.fixture
async def plane() -> AsyncIterator[GlobalPlane]:
    glob = await start_global_plane(GlobalSettings(dev_key="", database_url="sqlite://", insecure=True))
    try:
        yield glob
    finally:
        await glob.stop(0.5)


async def admin(plane: GlobalPlane, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmmesh",
        "admin",
        *args,
        "--global-address",
        plane.address,
        "--insecure",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def admin_json(plane: GlobalPlane, *args: str) -> dict[str, object]:
    status, out, err = await admin(plane, *args, "--json")
    assert status == 0, err
    answer: dict[str, object] = json.loads(out)
    return answer


@pytest.mark.asyncio
async def test_register_price_weight_and_retire(plane: GlobalPlane) -> None:
    register = (
        "model",
        "register",
        "big",
        "--tier",
        "large",
        "--input-price",
        "0.004",
        "--output-price",
        "0.012",
    )
    big = await admin_json(plane, *register)
    assert (big["tier"], big["pricing"]) == (
        "MODEL_TIER_LARGE",
        {"input_per_1k_usd": "0.004", "output_per_1k_usd": "0.012"},
    )
    assert big["kind"] == "MODEL_KIND_CHAT"
    embed = await admin_json(plane, *register[:2], "embed-big", "--kind", "embedding", *register[3:])
    assert embed["kind"] == "MODEL_KIND_EMBEDDING"
    status, _, err = await admin(plane, *register)
    assert status == 2 and err.strip().endswith("change it with price, weight or retire (MODEL_EXISTS)")
    priced = await admin_json(
        plane, "model", "price", "big", "--input-price", "0.005", "--output-price", "0.015"
    )
    assert priced["pricing"] == {"input_per_1k_usd": "0.005", "output_per_1k_usd": "0.015"}
    await admin_json(plane, *register[:2], "big-v2", *register[3:])
    canary = await admin_json(plane, "model", "weight", "big-v2", "--canary-of", "big", "--percent", "10")
    assert (canary["canary_of"], canary["canary_percent"]) == ("big", 10)
    status, out, _ = await admin(plane, "model", "list")
    assert status == 0 and "10% of big" in out
    kinds = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:] if line.strip()}
    assert [kinds[m] for m in ("big", "embed-big", "llmmesh-tiny-embed")] == ["chat", *["embedding"] * 2]
    assert (await plane.catalog.get_model("big")).canaries == (("big-v2", 10),)
    # A model with a live canary is not retired under it.
    status, _, err = await admin(plane, "model", "retire", "big")
    assert status == 2 and "has canary 'big-v2'" in err
    await admin_json(plane, "model", "weight", "big-v2", "--canary-of", "big", "--percent", "0")
    assert (await admin_json(plane, "model", "retire", "big"))["retired"] is True
    assert "retired" not in await admin_json(plane, "model", "retire", "big", "--undo")
    status, out, err = await admin(plane, "audit", "--json")
    assert status == 0, err
    changes = [(e["method"], e["target"]) for e in json.loads(out)]
    assert changes.count(("UpsertModel", "big")) == 4 and changes.count(("UpsertModel", "big-v2")) == 3


@pytest.mark.asyncio
async def test_bad_input_is_one_line_and_status_2(plane: GlobalPlane) -> None:
    status, _, err = await admin(
        plane, "model", "price", "ghost", "--input-price", "1", "--output-price", "1"
    )
    assert status == 2 and err.strip() == "llmmesh admin: unknown model 'ghost' (UNKNOWN_MODEL)"
    status, _, err = await admin(plane, "model", "retire", "llmmesh-tiny")
    assert status == 2 and "make another model their default before retiring it" in err
    status, _, err = await admin(
        plane, "model", "price", "llmmesh-tiny", "--input-price", "-1", "--output-price", "1"
    )
    assert status == 2 and "pricing.input_per_1k_usd must be a decimal >= 0" in err
    status, _, err = await admin(
        plane, "model", "weight", "llmmesh-tiny", "--canary-of", "x", "--percent", "120"
    )
    assert status == 2 and "a percent is a whole number from 0 to 100" in err

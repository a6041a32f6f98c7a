"""An edge's location: sent as the client location hint on every route it
asks for, so its clients' turns go to the nearest region of their zone."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from llmmesh.edge.settings import EdgeSettings
from tests.multiregion import RegionSpec, running_multiregion
from tests.stack import DEV_KEY

PORTLAND = "45.5,-122.7"  # near us-west (45.6,-121.2)
WASHINGTON = "38.9,-77.0"  # near us-east (39.0,-77.5)


async def served_by(edge_url: str) -> str:
    body = {"model": "auto", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    async with httpx.AsyncClient(base_url=edge_url, timeout=30) as http:
        resp = await http.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {DEV_KEY}"}
        )
    assert resp.status_code == 200, resp.text
    return resp.headers["x-llmmesh-region"]


@pytest.mark.asyncio
async def test_each_edge_sends_its_clients_to_the_region_nearest_it(tmp_path: Path) -> None:
    specs = [RegionSpec("us-east", "us"), RegionSpec("us-west", "us")]
    async with running_multiregion(specs, store_dir=tmp_path, edge={"location": PORTLAND}) as mesh:
        builder = mesh.regions["us-east"].builder
        east = await builder.edge(mesh.global_plane.address, location=WASHINGTON)
        by_region = await builder.edge(mesh.global_plane.address, location="us-west")
        for _ in range(3):
            assert await served_by(mesh.url) == "us-west"
            assert await served_by(east.url) == "us-east"
            assert await served_by(by_region.url) == "us-west"


@pytest.mark.parametrize("location", ["us-east", "45.5,-122.7", "-33.9,151.2", ""])
def test_a_location_is_a_region_name_or_a_point(location: str) -> None:
    assert EdgeSettings(location=location).location == location


@pytest.mark.parametrize("location", ["Portland, Oregon", "91,0", "45.5", "45.5,-190", "lat,lon"])
def test_any_other_location_is_refused_at_start_naming_the_setting(location: str) -> None:
    with pytest.raises(ValueError, match="location must be a region name or 'lat,lon'"):
        EdgeSettings(location=location)

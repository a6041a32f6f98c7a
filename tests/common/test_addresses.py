"""Bind and advertised addresses: their shape, and the refusal to advertise a wildcard."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.cli.main import main
from llmmesh.core.addresses import (
    AddressError,
    advertised_address,
    advertised_url,
    check_advertisable,
    join_host_port,
    split_host_port,
)
from llmmesh.globalplane.server import start_global_plane
from llmmesh.globalplane.settings import GlobalSettings


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("127.0.0.1:50051", ("127.0.0.1", 50051)),
        ("region-a.mesh.svc:443", ("region-a.mesh.svc", 443)),
        ("[::1]:8080", ("::1", 8080)),
        (" 10.0.0.2:1 ", ("10.0.0.2", 1)),
    ],
)
def test_host_port_is_split(text: str, parts: tuple[str, int]) -> None:
    assert split_host_port(text) == parts


@pytest.mark.parametrize(
    "text",
    [
        "",
        "127.0.0.1",
        ":80",
        "host:",
        "host:0",
        "host:65536",
        "host:http",
        "::1:80",
        "[::1:80",
        "a_b:1",
        "-a:1",
    ],
)
def test_malformed_addresses_are_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(AddressError, match="advertise_address"):
        split_host_port(text, "advertise_address")


@given(st.ip_addresses(), st.integers(min_value=1, max_value=65535))
def test_join_and_split_round_trip(ip: object, port: int) -> None:
    host = str(ip)
    assert split_host_port(join_host_port(host, port)) == (host, port)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_a_wildcard_bind_is_never_advertised(host: str) -> None:
    with pytest.raises(AddressError, match="--advertise-address"):
        check_advertisable(host, "", "region eu-west")
    with pytest.raises(AddressError, match="region eu-west binds"):
        advertised_address(join_host_port(host or "0.0.0.0", 7000), "", "region eu-west")


def test_the_advertised_address_wins_over_the_bound_one() -> None:
    assert advertised_address("0.0.0.0:7000", "region-a.example:443", "r") == "region-a.example:443"
    assert advertised_address("10.1.2.3:7000", "", "r") == "10.1.2.3:7000"
    # A host alone advertises the port bound: a port picked at start.
    assert advertised_address("0.0.0.0:7000", "region-a.example", "r") == "region-a.example:7000"
    assert advertised_address("[::]:7000", "[fd00::7]", "r") == "[fd00::7]:7000"
    assert advertised_address(":7000", "10.1.2.3:443", "r") == "10.1.2.3:443"


@pytest.mark.parametrize("advertised", ["0.0.0.0", "0.0.0.0:80", "[::]", "host:0", "a b", "[zz]"])
def test_an_advertised_address_must_be_dialable(advertised: str) -> None:
    with pytest.raises(AddressError, match="advertise_address"):
        check_advertisable("0.0.0.0", advertised, "the edge")


@pytest.mark.asyncio
async def test_a_global_plane_bound_to_every_interface_refuses_to_start_unadvertised() -> None:
    settings = GlobalSettings(host="0.0.0.0", port=0, insecure=True, database_url="sqlite://")
    with pytest.raises(AddressError, match="--advertise-address"):
        await start_global_plane(settings)


@pytest.mark.asyncio
async def test_a_global_plane_bound_to_every_interface_serves_its_advertised_address() -> None:
    settings = GlobalSettings(
        host="0.0.0.0",
        port=0,
        insecure=True,
        database_url="sqlite://",
        advertise_address="mesh-global:50051",
        metrics_port=0,
    )
    plane = await start_global_plane(settings)
    try:
        assert plane.address == "mesh-global:50051"
        # Its /metrics, bound beside it on every interface, is named by the advertised host too.
        assert plane.metrics is not None and plane.metrics.url.startswith("http://0.0.0.0:")
        port = plane.metrics.url.rpartition(":")[2].split("/")[0]
        assert plane.metrics_url == f"http://mesh-global:{port}/metrics"
    finally:
        await plane.stop()


def test_an_endpoint_beside_a_server_is_reached_at_its_advertised_host() -> None:
    assert (
        advertised_url("http://0.0.0.0:9100/metrics", "pod-a.mesh:50061") == "http://pod-a.mesh:9100/metrics"
    )
    assert advertised_url("http://[::]:9100/metrics", "[fd00::1]:1") == "http://[fd00::1]:9100/metrics"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["region", "--global-address", "nohost", "--engine-addresses", "127.0.0.1:5"], "global_address"),
        (["region", "--engine-addresses", "127.0.0.1:5,pod-b:0"], "engine_addresses"),
        (["edge", "--global-address", "x y:1"], "global_address"),
        (["global", "--host", "0.0.0.0", "--database-url", "sqlite://"], "--advertise-address"),
    ],
)
def test_a_plane_given_an_address_it_cannot_use_says_which_and_exits_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([argv[0], "--insecure", *argv[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"llmmesh {argv[0]}: ") and said in err

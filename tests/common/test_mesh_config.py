"""The mesh topology in TOML: the built-in default, the shipped examples,
what a valid file means, and a one-line error naming the key for each
mistake, also from ``llmmesh up --config`` (exit status 2)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.cli.main import main
from llmmesh.topology.mesh_config import (
    MeshConfig,
    MeshConfigError,
    RegionConfig,
    ZoneConfig,
    default_mesh_config,
    load_mesh_config,
    parse_mesh_config,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"

TWO_ZONES = """
[zones.us.regions.us-east]
[zones.eu.regions.eu-west]
pods = 2
"""


def test_the_default_is_two_zones_of_two_regions_with_a_simulator_pod_each() -> None:
    config = default_mesh_config()
    assert [z.name for z in config.zones] == ["us", "eu"]
    assert [[r.name for r in z.regions] for z in config.zones] == [
        ["us-east", "us-west"],
        ["eu-west", "eu-central"],
    ]
    assert all(r.pods == 1 and config.backend_of(r) == "sim" for r in config.regions())
    assert all(z.store_url == "" for z in config.zones)
    assert config.edge_port == 8080 and config.redis_url == ""


def test_each_zone_has_its_own_redis_or_the_meshs() -> None:
    config = parse_mesh_config(
        "[mesh]\nredis_url = 'redis://shared:6379/0'\n"
        "[zones.eu]\nredis_url = 'rediss://redis-eu:6380/0'\n[zones.eu.regions.eu-west]\n"
        "[zones.us.regions.us-east]\n"
    )
    assert {z.name: config.redis_url_of(z) for z in config.zones} == {
        "eu": "rediss://redis-eu:6380/0",
        "us": "redis://shared:6379/0",
    }
    # Zones may share a server only when the configuration says so.
    shared = parse_mesh_config("[mesh]\nredis_url = 'redis://r/0'\nshared_redis_ok = true\n" + TWO_ZONES)
    assert shared.shared_redis_ok and {shared.redis_url_of(z) for z in shared.zones} == {"redis://r/0"}
    # What `llmmesh up` runs: each zone's own URL, none mesh-wide.
    embedded = config.with_zone_redis({"us": "redis://127.0.0.1:7001/0"})
    assert embedded.redis_url == ""
    assert [embedded.redis_url_of(z) for z in embedded.zones] == ["", "redis://127.0.0.1:7001/0"]


def test_the_vllm_default_keeps_one_region_per_zone() -> None:
    config = default_mesh_config("vllm")
    assert [r.name for r in config.regions()] == ["us-east", "eu-west"]
    assert all(config.backend_of(r) == "vllm" for r in config.regions())


def test_embedded_example_is_the_built_in_default() -> None:
    assert load_mesh_config(EXAMPLES / "embedded.toml") == default_mesh_config()


def test_production_example_uses_cockroachdb_and_redis() -> None:
    config = load_mesh_config(EXAMPLES / "production.toml")
    assert config.redis_url == "" and not config.shared_redis_ok
    assert all(z.redis_url.startswith(f"rediss://redis-{z.name}.") for z in config.zones)
    assert config.global_store_url.startswith("cockroachdb+psycopg://")
    assert all(z.store_url.startswith("cockroachdb+psycopg://") for z in config.zones)
    assert {r.zone for r in config.regions()} == {"us", "eu"}
    assert all(r.pods == 2 and r.port and config.backend_of(r) == "vllm" for r in config.regions())


def test_a_minimal_file_takes_every_default() -> None:
    config = parse_mesh_config(TWO_ZONES)
    assert config == MeshConfig(
        zones=(
            ZoneConfig("us", (RegionConfig("us-east", "us"),)),
            ZoneConfig("eu", (RegionConfig("eu-west", "eu", pods=2),)),
        )
    )
    assert config.zone("eu").regions[0].pod_ids() == ["eu-west-pod-0", "eu-west-pod-1"]


def test_zone_store_defaults_to_sqlite_under_the_home(tmp_path: Path) -> None:
    config = parse_mesh_config(TWO_ZONES + '[zones.us]\nstore_url = "postgresql+psycopg://db/us"\n')
    assert config.zone("eu").store_database_url(tmp_path) == f"sqlite:///{tmp_path}/zone-eu.db"
    assert config.zone("us").store_database_url(tmp_path) == "postgresql+psycopg://db/us"


def test_a_region_backend_overrides_the_mesh_default() -> None:
    config = parse_mesh_config(TWO_ZONES + '[zones.us.regions.us-west]\nbackend = "vllm"\n')
    backends = {r.name: config.backend_of(r) for r in config.with_overrides(backend="sim").regions()}
    assert backends == {"us-east": "sim", "us-west": "vllm", "eu-west": "sim"}


def test_one_cockroachdb_database_may_hold_every_zone() -> None:
    url = "cockroachdb+psycopg://root@crdb:26257/llmmesh"
    config = parse_mesh_config(
        TWO_ZONES + f'[zones.us]\nstore_url = "{url}"\n[zones.eu]\nstore_url = "{url}"\n'
    )
    assert {z.store_url for z in config.zones} == {url}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[zones.us.regions.us-east\n", "invalid TOML"),
        ("colour = 1\n" + TWO_ZONES, "unknown key 'colour'"),
        ("[mesh]\nedge_prot = 1\n" + TWO_ZONES, "unknown key 'mesh.edge_prot'"),
        (TWO_ZONES + "[zones.us]\nstore = 'x'\n", "unknown key 'zones.us.store'"),
        (TWO_ZONES.replace("pods = 2", "podz = 2"), "unknown key 'zones.eu.regions.eu-west.podz'"),
        (
            TWO_ZONES.replace("pods = 2", "pods = 0"),
            "zones.eu.regions.eu-west.pods must be at least 1, got 0",
        ),
        (TWO_ZONES.replace("pods = 2", "pods = '2'"), "zones.eu.regions.eu-west.pods must be an integer"),
        (TWO_ZONES.replace("pods = 2", "pods = 1.5"), "zones.eu.regions.eu-west.pods must be an integer"),
        (TWO_ZONES.replace("pods = 2", "backend = 'gpu'"), "zones.eu.regions.eu-west.backend must be one of"),
        ("[mesh]\nbackend = 'tpu'\n" + TWO_ZONES, "mesh.backend must be one of sim, vllm, got 'tpu'"),
        ("[mesh]\nedge_port = true\n" + TWO_ZONES, "mesh.edge_port must be an integer, got a boolean"),
        ("[mesh]\nedge_port = 70000\n" + TWO_ZONES, "mesh.edge_port must be a port from 0 to 65535"),
        (TWO_ZONES + "[zones.us.regions.us-west]\n[zones.eu.regions.us-west]\n", "'us-west' is in two zones"),
        (TWO_ZONES + "[zones.us.regions.us-east]\npods = 3\n", "invalid TOML"),
        ("", "no zones"),
        ("[zones.us]\n", "zones.us has no regions"),
        ("[zones.US.regions.us-east]\n", "'US' is not a zone name"),
        ("[zones.north-america.regions.us-east]\n", "'north-america' is not a zone name"),
        ("[zones.us.regions.East]\n", "'East' is not a region name"),
        ("zones = 3\n", "zones must be a table, got an integer"),
        ("[mesh]\nredis_url = 'localhost:6379'\n" + TWO_ZONES, "mesh.redis_url must be a redis://"),
        (TWO_ZONES + "[zones.eu]\nredis_url = 'http://r'\n", "zones.eu.redis_url must be a redis://"),
        (
            "[mesh]\nredis_url = 'redis://r:6379/0'\n" + TWO_ZONES,
            "zones us and eu share one Redis (mesh.redis_url names r:6379 for both)",
        ),
        (
            TWO_ZONES
            + "[zones.us]\nredis_url = 'redis://R/1'\n[zones.eu]\nredis_url = 'rediss://r:6379/2'\n",
            "zones us and eu share one Redis (zones.us.redis_url and zones.eu.redis_url name r:6379)",
        ),
        ("[mesh]\nshared_redis_ok = 'yes'\n" + TWO_ZONES, "mesh.shared_redis_ok must be a boolean"),
        (TWO_ZONES + "[zones.us]\nstore_url = 'not a url'\n", "zones.us.store_url is not a SQLAlchemy URL"),
        (
            TWO_ZONES + "[zones.us]\nstore_url = 'mysql://db/x'\n",
            "must be a sqlite, postgresql, cockroachdb URL",
        ),
        (
            TWO_ZONES + "[zones.us]\nstore_url = 'cockroachdb+psycopg2://db/x'\n",
            "like cockroachdb+psycopg://",
        ),
        (
            TWO_ZONES.replace("pods = 2", "database_region = 'us east'"),
            "database_region must be a CockroachDB region name",
        ),
        (
            TWO_ZONES
            + "[zones.us]\nstore_url = 'sqlite:///one.db'\n[zones.eu]\nstore_url = 'sqlite:///one.db'\n",
            "zones.eu.store_url is zone us's store too",
        ),
        (
            "[mesh]\nglobal_port = 50051\n" + TWO_ZONES.replace("pods = 2", "port = 50051"),
            "zones.eu.regions.eu-west.port is port 50051, which mesh.global_port already uses",
        ),
        (TWO_ZONES.replace("pods = 2", "location = '91,0'"), "location must be 'lat,lon' in degrees"),
        (TWO_ZONES.replace("pods = 2", "location = 'Dublin'"), "location must be 'lat,lon' in degrees"),
    ],
)
def test_mistakes_are_one_line_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(MeshConfigError) as info:
        parse_mesh_config(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_overrides_are_validated_too() -> None:
    with pytest.raises(MeshConfigError, match=r"mesh\.edge_port"):
        default_mesh_config().with_overrides(edge_port=-1)
    assert default_mesh_config().with_overrides(edge_port=0, host=None).edge_port == 0


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(MeshConfigError, match="cannot read it"):
        load_mesh_config(tmp_path / "nope.toml")


def test_an_unknown_zone_is_named() -> None:
    with pytest.raises(MeshConfigError, match=r"zone 'ap' is not in the configuration \(zones: us, eu\)"):
        default_mesh_config().zone("ap")


@pytest.mark.parametrize(
    ("content", "flags", "message"),
    [
        ("[zones.us.regions.us-east]\npods = 0\n", (), "pods must be at least 1"),
        (TWO_ZONES, ("--zone", "ap"), "zone 'ap' is not in the configuration"),
        (TWO_ZONES, ("--edge-port", "99999"), "mesh.edge_port must be a port"),
    ],
)
def test_up_refuses_a_bad_config_with_status_2_and_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, flags: tuple[str, ...], message: str
) -> None:
    path = tmp_path / "mesh.toml"
    path.write_text(content)
    assert main(["up", "--config", str(path), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("llmmesh up: ") and message in err
    assert "\n" not in err


# ---------------------------------------------------------------- round trip

_names = st.lists(st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True), min_size=1, max_size=5, unique=True)
_regions = st.builds(
    RegionConfig,
    name=st.just(""),
    zone=st.just(""),
    pods=st.integers(1, 4),
    backend=st.sampled_from(["", "sim", "vllm"]),
    location=st.sampled_from(["", "0.0,0.0", "-33.9,151.2"]),
)


@st.composite
def mesh_configs(draw: st.DrawFn) -> MeshConfig:
    zone_names = draw(
        st.lists(st.from_regex(r"[a-z][a-z0-9]{0,3}", fullmatch=True), min_size=1, max_size=3, unique=True)
    )
    zones = []
    for zone in zone_names:
        regions = [
            dataclasses.replace(draw(_regions), name=f"{zone}-{suffix}", zone=zone) for suffix in draw(_names)
        ]
        zones.append(ZoneConfig(zone, tuple(regions), draw(st.sampled_from(["", f"sqlite:///{zone}.db"]))))
    return MeshConfig(
        zones=tuple(zones),
        edge_port=draw(st.integers(0, 65535)),
        backend=draw(st.sampled_from(["sim", "vllm"])),
    )


def to_toml(config: MeshConfig) -> str:
    lines = ["[mesh]", f"edge_port = {config.edge_port}", f'backend = "{config.backend}"']
    for zone in config.zones:
        lines += [f"[zones.{zone.name}]", f'store_url = "{zone.store_url}"']
        for region in zone.regions:
            lines += [f"[zones.{zone.name}.regions.{region.name}]", f"pods = {region.pods}"]
            lines += [f'backend = "{region.backend}"', f'location = "{region.location}"']
    return "\n".join(lines) + "\n"


@given(mesh_configs())
def test_what_is_written_reads_back_the_same(config: MeshConfig) -> None:
    assert parse_mesh_config(to_toml(config)) == config

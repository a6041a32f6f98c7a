"""Which Redis each zone of ``llmmesh up`` runs with: a ``redis-server``
of its own by default, so a key's limits hold across the regions of its
zone; a configured ``redis_url`` when there is one; none (with a warning)
when asked, or when no ``redis-server`` is installed. No mesh is started."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmmesh.cli.embedded_redis import choose_redis, redis_probe
from llmmesh.cli.supervisor import MeshStartError, RestartPolicy, Supervisor
from llmmesh.cli.up import MeshLauncher, add_up_arguments, mesh_config_of
from llmmesh.topology.mesh_config import MeshConfig, default_mesh_config

CONFIGURED = {"us": "redis://redis-us.internal:6379/2", "eu": "rediss://redis-eu.internal:6380/0"}


def installed(name: str) -> str | None:
    return f"/usr/bin/{name}"


def missing(name: str) -> str | None:
    return None


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_up_arguments(parser)
    return parser.parse_args(list(argv))


def configured(zones: tuple[str, ...] = ("us", "eu")) -> MeshConfig:
    return default_mesh_config().with_zone_redis({zone: CONFIGURED[zone] for zone in zones})


def zone_urls(config: MeshConfig) -> dict[str, str]:
    return {zone.name: config.redis_url_of(zone) for zone in config.zones}


def test_the_default_mesh_runs_its_own_redis() -> None:
    args = parsed()
    config, _ = mesh_config_of(args)
    config, redis = choose_redis(args.redis, config, installed)
    assert redis.embedded_zones == ("us", "eu")  # one redis-server per zone
    assert zone_urls(config) == {"us": "", "eu": ""}  # the launcher fills in its own servers' URLs
    assert redis.warning == ""


def test_a_configured_redis_url_is_used_as_it_is() -> None:
    config, redis = choose_redis(parsed().redis, configured(), installed)
    assert not redis.embedded and redis.warning == ""
    assert zone_urls(config) == CONFIGURED


def test_a_zone_without_a_configured_redis_gets_one_of_its_own() -> None:
    config, redis = choose_redis(parsed().redis, configured(("eu",)), installed)
    assert redis.embedded_zones == ("us",)
    assert zone_urls(config) == {"us": "", "eu": CONFIGURED["eu"]}


def test_redis_embedded_replaces_a_configured_url() -> None:
    config, redis = choose_redis(parsed("--redis", "embedded").redis, configured(), installed)
    assert redis.embedded_zones == ("us", "eu") and zone_urls(config) == {"us": "", "eu": ""}


def test_redis_none_opts_out_and_warns_that_limits_are_per_region() -> None:
    args = parsed("--redis", "none")
    config, redis = choose_redis(args.redis, default_mesh_config(), installed)
    assert not redis.embedded and config.redis_url == ""
    assert "counted by each region on its own" in redis.warning
    assert "N times its limits" in redis.warning
    config, redis = choose_redis(args.redis, configured(), installed)
    assert zone_urls(config) == {"us": "", "eu": ""}
    assert "the configured Redis is ignored" in redis.warning


def test_without_redis_server_the_mesh_runs_without_redis_and_warns() -> None:
    config, redis = choose_redis(parsed().redis, default_mesh_config(), missing)
    assert not redis.embedded and zone_urls(config) == {"us": "", "eu": ""}
    assert redis.warning.startswith("redis-server is not on the PATH, so zone us, eu runs without Redis")
    assert "counted by each region on its own" in redis.warning


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="--redis must be one of"):
        choose_redis("sometimes", default_mesh_config())


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    supervisor = Supervisor(tmp_path, 10.0, RestartPolicy(enabled=False), lambda text: None)
    yield supervisor
    supervisor.stop_all()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_the_launcher_starts_a_redis_per_zone_and_gives_each_zone_its_own(sup: Supervisor) -> None:
    args = parsed("--edge-port", "0")
    config, zone = mesh_config_of(args)
    config, redis = choose_redis(args.redis, config)
    launcher = MeshLauncher(sup, config, zone, args.dev_key, embedded_redis=redis.embedded_zones)
    launcher.start_redis()
    assert sorted(launcher.redis) == ["eu", "us"]
    addresses = {zone: plane.address() for zone, plane in launcher.redis.items()}
    assert len(set(addresses.values())) == 2
    for address in addresses.values():
        host, _, port = address.rpartition(":")
        assert redis_probe(host, int(port))() is not None
    assert launcher.redis_urls == {zone: f"redis://{address}/0" for zone, address in addresses.items()}
    # A region gets its zone's Redis; the edge each zone's, by zone.
    assert launcher._redis_env("eu") == {"LLMMESH_REDIS_URL": launcher.redis_urls["eu"]}
    assert launcher._redis_env("us") == {"LLMMESH_REDIS_URL": launcher.redis_urls["us"]}
    edge = launcher._edge_redis_env()["LLMMESH_REDIS_URLS"]
    assert sorted(edge.split(",")) == sorted(f"{zone}={url}" for zone, url in launcher.redis_urls.items())


def test_the_launcher_starts_no_redis_when_none_is_chosen(sup: Supervisor) -> None:
    config, redis = choose_redis("none", configured())
    launcher = MeshLauncher(sup, config, "us", "sk-test", embedded_redis=redis.embedded_zones)
    launcher.start_redis()
    assert launcher.redis == {} and launcher._redis_env("us") == launcher._edge_redis_env() == {}
    assert not sup.planes


def test_redis_embedded_without_redis_server_stops_the_mesh(
    sup: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "")
    launcher = MeshLauncher(sup, default_mesh_config(), "us", "sk-test", embedded_redis=("us",))
    with pytest.raises(MeshStartError, match="needs redis-server on the PATH"):
        launcher.start_redis()

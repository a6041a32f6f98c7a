"""The topology ``llmmesh up`` runs, read from TOML: zones, their regions, each
region's engine pods, a store and a Redis per zone, and ports.

::

    [mesh]
    edge_port = 8080                       # 0 picks a free port
    backend = "sim"                        # pods' engine where a region names none: sim | vllm

    [zones.eu]
    store_url = "cockroachdb+psycopg://…"  # empty: sqlite:///$LLMMESH_HOME/zone-eu.db
    redis_url = "rediss://redis-eu…"       # empty: mesh.redis_url, else one `llmmesh up` runs

    [zones.eu.regions.eu-west]
    location = "53.3,-6.3"
    pods = 2
    database_region = "europe-west1"       # CockroachDB: the region homing its rows (default: its name)

    [zones.eu.regions.eu-central.models]   # a model fleet: pods per model
    llmmesh-small = 1
    llmmesh-large = 1

A region names either ``pods`` (that many pods of the engine's default
model) or a ``models`` table (pods per model; ``pods`` may then be left
out, or must be their sum). Models of the family (:mod:`llmmesh.core.model_family`)
get their simulated per-size costs and, with ``llmmesh up``, their
registry entries; ``deploy/examples/fleet.toml`` is a fleet.

Every region of a zone uses the zone's store, and a store serves one zone:
two zones may name the same URL only on CockroachDB, where a super region
per zone keeps each zone's rows inside it (:mod:`region.zone_store.ddl`).
Every region of a zone and the edge, for that zone's tenants, use the
zone's Redis (rate limits, the KV prefix index, stream logs holding reply
text): ``zones.NAME.redis_url``, else ``mesh.redis_url``. Two zones whose
Redis is one server (same host and port, whatever the database number) are
refused unless ``mesh.shared_redis_ok = true`` says the zones may share it:
one zone's content would otherwise sit in a store the other reaches, and a
configuration that predates per-zone Redis would keep doing so silently.
Anything else wrong (an unknown key, a value of the wrong type, a region in
two zones, a zone without regions, a region without pods, an unknown
backend, a port used twice) is a :class:`MeshConfigError` whose one-line
message names the key. ``deploy/examples/embedded.toml`` is the built-in
default written out; ``deploy/examples/production.toml`` a documented
production topology.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa

from llmmesh.core.ids import ConversationId, is_valid_name
from llmmesh.core.sqlstore import with_store_driver

BACKENDS = ("sim", "vllm")
"""Engine backends a pod can run."""
STORE_BACKENDS = ("sqlite", "postgresql", "cockroachdb")
"""SQL databases a zone store can live in."""
REDIS_SCHEMES = ("redis", "rediss", "unix")
# The registry's rule for model names (globalplane.model_catalog), less "auto".
_MODEL_NAME = re.compile(r"^(?!auto$)[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")

T = TypeVar("T")


_DATABASE_REGION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class MeshConfigError(ValueError):
    """The configuration cannot run; the message is one line that names the key at fault."""


@dataclass(frozen=True)
class RegionConfig:
    """One region of a zone and the engine pods behind it."""

    name: str
    zone: str
    pods: int = 1
    backend: str = ""
    """Engine backend of its pods; empty for the mesh's default."""
    location: str = ""
    """'lat,lon' for proximity routing; empty for the region plane's default."""
    port: int = 0
    """Port of its ChatService; 0 picks a free one."""
    models: tuple[tuple[str, int], ...] = ()
    """Pods per model, in the order given; empty: ``pods`` pods of the engine's default model."""
    database_region: str = ""
    """The CockroachDB region (a node's ``--locality region=``) that homes the
    rows of the conversations this region starts; empty: the region's own name.
    Only ``llmmesh db upgrade`` on CockroachDB reads it."""

    def pod_ids(self) -> list[str]:
        """The names of its pods: ``<region>-pod-<n>``."""
        return [f"{self.name}-pod-{n}" for n in range(self.pods)]

    def pod_models(self) -> list[tuple[str, str]]:
        """Each pod and the model it serves ("" for the engine's default), in pod order."""
        names = [name for name, count in self.models for _ in range(count)] or [""] * self.pods
        return list(zip(self.pod_ids(), names, strict=True))


@dataclass(frozen=True)
class ZoneConfig:
    """A zone (jurisdiction), its store and its regions, in the order given."""

    name: str
    regions: tuple[RegionConfig, ...]
    store_url: str = ""
    """SQLAlchemy URL of the zone store; empty for SQLite under the mesh home."""
    redis_url: str = ""
    """The zone's Redis; empty: the mesh's ``redis_url``."""

    def store_database_url(self, home: Path) -> str:
        """The store URL, or ``sqlite:///HOME/zone-<zone>.db`` when none is set."""
        return self.store_url or f"sqlite:///{home / f'zone-{self.name}.db'}"


@dataclass(frozen=True)
class MeshConfig:
    """A whole mesh: one global plane, one edge, the zones' regions and pods."""

    zones: tuple[ZoneConfig, ...]
    host: str = "127.0.0.1"
    """Address every plane binds."""
    edge_port: int = 8080
    """HTTP port of the edge; 0 picks a free one."""
    global_port: int = 0
    """gRPC port of the global plane; 0 picks a free one."""
    backend: str = "sim"
    """Engine backend of the pods of regions that name none."""
    redis_url: str = ""
    """Redis shared by the regions (rate limits, prefix index) and the edge
    (stream log); empty: ``llmmesh up`` runs a ``redis-server`` of its own
    when one is on the PATH, else keeps that state in each process
    (:func:`llmmesh.cli.embedded_redis.choose_redis`)."""
    global_store_url: str = ""
    """SQLAlchemy URL of the global plane's store; empty for SQLite under the mesh home."""
    shared_redis_ok: bool = False
    """Whether zones may share one Redis server (one jurisdiction, or a test
    bench); without it two zones on one server are refused."""

    def redis_url_of(self, zone: ZoneConfig) -> str:
        """The Redis of ``zone``'s regions and of the edge for its tenants ("" for none)."""
        return zone.redis_url or self.redis_url

    def with_zone_redis(self, urls: Mapping[str, str]) -> MeshConfig:
        """This configuration with each zone's Redis set to ``urls[zone]``
        (a zone not named, or named with "", gets none) and no mesh-wide
        one; validated again."""
        zones = tuple(dataclasses.replace(z, redis_url=urls.get(z.name, "")) for z in self.zones)
        updated = dataclasses.replace(self, zones=zones, redis_url="")
        validate(updated)
        return updated

    def regions(self) -> Iterator[RegionConfig]:
        """Every region, zone by zone."""
        for zone in self.zones:
            yield from zone.regions

    def zone(self, name: str) -> ZoneConfig:
        """The zone called ``name``; MeshConfigError when there is none."""
        for zone in self.zones:
            if zone.name == name:
                return zone
        known = ", ".join(z.name for z in self.zones)
        raise MeshConfigError(f"zone {name!r} is not in the configuration (zones: {known})")

    def backend_of(self, region: RegionConfig) -> str:
        """The engine backend of ``region``'s pods."""
        return region.backend or self.backend

    def with_overrides(
        self,
        *,
        backend: str | None = None,
        edge_port: int | None = None,
        host: str | None = None,
        redis_url: str | None = None,
    ) -> MeshConfig:
        """This configuration with command-line values put over it; validated again."""
        changes: dict[str, Any] = {"backend": backend, "edge_port": edge_port, "host": host}
        changes["redis_url"] = redis_url
        updated = dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
        validate(updated)
        return updated


def default_mesh_config(backend: str = "sim") -> MeshConfig:
    """The built-in topology: zone ``us`` (``us-east``, ``us-west``) and zone
    ``eu`` (``eu-west``, ``eu-central``), one pod each, SQLite per zone.

    With ``backend="vllm"`` each zone keeps only its first region: a
    vLLM-CPU pod holds about 3 GiB and takes up to a minute of two cores to
    start, so one per zone is what a laptop runs comfortably.
    """
    us: tuple[RegionConfig, ...] = (
        RegionConfig("us-east", "us", location="39.0,-77.5"),
        RegionConfig("us-west", "us", location="45.6,-121.2"),
    )
    eu: tuple[RegionConfig, ...] = (
        RegionConfig("eu-west", "eu", location="53.3,-6.3"),
        RegionConfig("eu-central", "eu", location="50.1,8.7"),
    )
    if backend == "vllm":
        us, eu = us[:1], eu[:1]
    config = MeshConfig(zones=(ZoneConfig("us", us), ZoneConfig("eu", eu)), backend=backend)
    validate(config)
    return config


def load_mesh_config(path: Path) -> MeshConfig:
    """Read and validate the TOML file at ``path``; errors name the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise MeshConfigError(f"{path}: cannot read it: {err}") from None
    try:
        return parse_mesh_config(text)
    except MeshConfigError as err:
        raise MeshConfigError(f"{path}: {err}") from None


def parse_mesh_config(text: str) -> MeshConfig:
    """The validated configuration in TOML ``text``."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise MeshConfigError(f"invalid TOML: {err}") from None
    root = _Table(document, "", ("mesh", "zones"))
    mesh = root.table("mesh")
    mesh.reject_unknown(
        ("host", "edge_port", "global_port", "backend", "redis_url", "shared_redis_ok", "global_store_url")
    )
    zones_table = root.table("zones")
    zones = tuple(_zone(name, zones_table.table(name)) for name in zones_table.names())
    config = MeshConfig(
        zones=zones,
        host=mesh.get("host", str, "127.0.0.1"),
        edge_port=mesh.get("edge_port", int, 8080),
        global_port=mesh.get("global_port", int, 0),
        backend=mesh.get("backend", str, "sim"),
        redis_url=mesh.get("redis_url", str, ""),
        global_store_url=mesh.get("global_store_url", str, ""),
        shared_redis_ok=mesh.get("shared_redis_ok", bool, False),
    )
    validate(config)
    return config


def _zone(name: str, table: _Table) -> ZoneConfig:
    table.reject_unknown(("store_url", "redis_url", "regions"))
    regions_table = table.table("regions")
    regions = []
    for region_name in regions_table.names():
        region = regions_table.table(region_name)
        region.reject_unknown(("pods", "backend", "location", "port", "models", "database_region"))
        models = _models(region.table("models"))
        counted = sum(count for _, count in models)
        pods = region.get("pods", int, counted or 1)
        if models and pods != counted:
            raise MeshConfigError(
                f"{region.key('pods')} is {pods} but {region.key('models')} names {counted} pods; "
                "leave pods out or make it their sum"
            )
        regions.append(
            RegionConfig(
                name=region_name,
                zone=name,
                models=models,
                pods=pods,
                backend=region.get("backend", str, ""),
                location=region.get("location", str, ""),
                port=region.get("port", int, 0),
                database_region=region.get("database_region", str, ""),
            )
        )
    return ZoneConfig(name, tuple(regions), table.get("store_url", str, ""), table.get("redis_url", str, ""))


def _models(table: _Table) -> tuple[tuple[str, int], ...]:
    """A region's ``models`` table: model name = pods, each at least 1."""
    models = []
    for model in table.names():
        count = table.get(model, int, 0)
        if count < 1:
            raise MeshConfigError(f"{table.key(model)} must be at least 1 pod, got {count}")
        if not _MODEL_NAME.match(model):
            raise MeshConfigError(f"{table.key(model)}: {model!r} cannot be a model name")
        models.append((model, count))
    return tuple(models)


class _Table:
    """One TOML table and its dotted path, for errors that name the key."""

    def __init__(self, raw: Mapping[str, Any], path: str, known: Sequence[str] | None = None) -> None:
        self.raw = raw
        self.path = path
        if known is not None:
            self.reject_unknown(known)

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def names(self) -> list[str]:
        return list(self.raw)

    def reject_unknown(self, known: Sequence[str]) -> None:
        for name in self.raw:
            if name not in known:
                raise MeshConfigError(f"unknown key {self.key(name)!r} (known here: {', '.join(known)})")

    def table(self, name: str) -> _Table:
        value = self.raw.get(name, {})
        if not isinstance(value, dict):
            raise MeshConfigError(f"{self.key(name)} must be a table, got {_kind(value)}")
        return _Table(value, self.key(name))

    def get(self, name: str, kind: type[T], default: T) -> T:
        value = self.raw.get(name, default)
        # TOML booleans are Python ints; a port of `true` is a mistake, not 1.
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise MeshConfigError(f"{self.key(name)} must be {_article(kind)}, got {_kind(value)} {value!r}")
        return value


def _article(kind: type) -> str:
    return {int: "an integer", str: "a string", bool: "a boolean"}.get(kind, kind.__name__)


def _kind(value: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array"}.get(
        type(value), "a table" if isinstance(value, dict) else type(value).__name__
    )


def validate(config: MeshConfig) -> None:
    """Raise MeshConfigError for the first thing in ``config`` that cannot run."""
    if config.backend not in BACKENDS:
        raise MeshConfigError(f"mesh.backend must be one of {', '.join(BACKENDS)}, got {config.backend!r}")
    if not config.host.strip():
        raise MeshConfigError("mesh.host must not be empty")
    _redis_scheme("mesh.redis_url", config.redis_url)
    if config.global_store_url:
        _store_backend("mesh.global_store_url", config.global_store_url)
    if not config.zones:
        raise MeshConfigError("no zones: a mesh needs at least one [zones.NAME] with one region")
    homes: dict[str, str] = {}
    stores: dict[str, str] = {}
    for zone in config.zones:
        _validate_zone(zone, config, homes, stores)
    _validate_redis(config)
    _validate_ports(config)


def _redis_scheme(key: str, url: str) -> None:
    if url and url.partition("://")[0] not in REDIS_SCHEMES:
        # The URL may hold a password: only its scheme is shown.
        raise MeshConfigError(
            f"{key} must be a redis://, rediss:// or unix:// URL, got one starting {url.partition(':')[0]!r}"
        )


def redis_server(url: str) -> str:
    """The server a Redis URL names, whatever its database, user or TLS:
    ``host:port`` (6379 by default), or the socket's path."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "unix":
        return parsed.path
    try:
        port = parsed.port or 6379
    except ValueError:
        port = 0
    return f"{(parsed.hostname or 'localhost').lower()}:{port}"


def _validate_redis(config: MeshConfig) -> None:
    """Each zone's Redis URL is one, and no two zones share a server unless allowed."""
    owners: dict[str, tuple[str, str]] = {}
    for zone in config.zones:
        own = bool(zone.redis_url)
        key = f"zones.{zone.name}.redis_url" if own else "mesh.redis_url"
        _redis_scheme(key, zone.redis_url)
        url = config.redis_url_of(zone)
        if not url or config.shared_redis_ok:
            continue
        server = redis_server(url)
        if server in owners:
            other, other_key = owners[server]
            named = (
                f"{key} names {server} for both"
                if key == other_key
                else f"{other_key} and {key} name {server}"
            )
            raise MeshConfigError(
                f"zones {other} and {zone.name} share one Redis ({named}), "
                f"which would hold either zone's stream logs and rate limits beside the other's: "
                f"give each zone its own zones.NAME.redis_url, or set mesh.shared_redis_ok = true "
                "where the zones may share one"
            )
        owners[server] = (zone.name, key)


def _validate_zone(
    zone: ZoneConfig, config: MeshConfig, homes: dict[str, str], stores: dict[str, str]
) -> None:
    where = f"zones.{zone.name}"
    # A conversation id names its zone and home region, so both must fit in one.
    if not _names_conversation(zone.name, "r"):
        raise MeshConfigError(
            f"{where}: {zone.name!r} is not a zone name (lowercase letters and digits, like 'eu')"
        )
    if not zone.regions:
        raise MeshConfigError(f"{where} has no regions: add [{where}.regions.NAME]")
    if zone.store_url:
        backend = _store_backend(f"{where}.store_url", zone.store_url)
        other = stores.get(zone.store_url)
        # One CockroachDB database holds every zone, a super region each; other stores hold one zone.
        if other is not None and backend != "cockroachdb":
            raise MeshConfigError(
                f"{where}.store_url is zone {other}'s store too; a {backend} store holds one zone's data"
            )
        stores.setdefault(zone.store_url, zone.name)
    for region in zone.regions:
        key = f"{where}.regions.{region.name}"
        if region.name in homes:
            raise MeshConfigError(
                f"region {region.name!r} is in two zones: {homes[region.name]} and {zone.name}"
            )
        homes[region.name] = zone.name
        if not _names_conversation(zone.name, region.name):
            raise MeshConfigError(
                f"{key}: {region.name!r} is not a region name (lowercase letters, digits and '-')"
            )
        if region.pods < 1:
            raise MeshConfigError(f"{key}.pods must be at least 1, got {region.pods}")
        if region.backend and region.backend not in BACKENDS:
            raise MeshConfigError(
                f"{key}.backend must be one of {', '.join(BACKENDS)}, got {region.backend!r}"
            )
        if region.location:
            _location(f"{key}.location", region.location)
        if region.database_region and not _DATABASE_REGION.match(region.database_region):
            raise MeshConfigError(
                f"{key}.database_region must be a CockroachDB region name (letters, digits, '.', '_', '-'), "
                f"got {region.database_region!r}"
            )


def _validate_ports(config: MeshConfig) -> None:
    ports = [("mesh.edge_port", config.edge_port), ("mesh.global_port", config.global_port)]
    ports += [(f"zones.{r.zone}.regions.{r.name}.port", r.port) for r in config.regions()]
    owners: dict[int, str] = {}
    for key, port in ports:
        if not 0 <= port <= 65535:
            raise MeshConfigError(f"{key} must be a port from 0 to 65535, got {port}")
        if port and port in owners:
            raise MeshConfigError(f"{key} is port {port}, which {owners[port]} already uses")
        owners.setdefault(port, key)


def _names_conversation(zone: str, region: str) -> bool:
    return (
        is_valid_name(region)
        and ConversationId.parse(str(ConversationId(zone, region, "0" * 16))) is not None
    )


def _store_backend(key: str, url: str) -> str:
    try:
        parsed = with_store_driver(url)
    except sa.exc.ArgumentError:
        raise MeshConfigError(f"{key} is not a SQLAlchemy URL: {url!r}") from None
    backend = parsed.get_backend_name()
    if backend not in STORE_BACKENDS:
        raise MeshConfigError(f"{key} must be a {', '.join(STORE_BACKENDS)} URL, got {backend!r}")
    try:
        parsed.get_dialect().import_dbapi()
    except ImportError as err:
        # A driver named in the URL that is not installed (plain URLs get psycopg 3).
        raise MeshConfigError(
            f"{key}: the {parsed.drivername} driver is not installed ({err}); name one that is, "
            f"like {backend}+psycopg://"
        ) from None
    return backend


def _location(key: str, text: str) -> None:
    lat_text, sep, lon_text = text.partition(",")
    try:
        lat, lon = float(lat_text), float(lon_text)
    except ValueError:
        lat = lon = float("nan")
    if not sep or not (-90 <= lat <= 90 and -180 <= lon <= 180):
        raise MeshConfigError(f"{key} must be 'lat,lon' in degrees, got {text!r}")

"""The region directory: regions report in; requests are routed inside their zone only.

Soft state rebuilt by heartbeats, so it answers from memory even in
production. The global plane also keeps each region's last heartbeat in
its store (:mod:`globalplane.region_reports`): a restarted replica starts
from those (:meth:`RegionDirectory.restore`), and every replica takes in
the ones its peers received (:meth:`RegionDirectory.merge`,
:mod:`globalplane.directory_sync`), so each routes on every region's
heartbeats whichever replica a region's connection reaches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import IntEnum

from llmmesh.core.errors import FailedPrecondition, InvalidArgument, NotFound, Reason
from llmmesh.core.ids import is_valid_name
from llmmesh.globalplane.clock import Clock, utc_now
from llmmesh.globalplane.paging import Page, paginate
from llmmesh.globalplane.tiers import require_zone

_EARTH_RADIUS_KM = 6371.0088


class RegionHealth(IntEnum):
    """A region's health; the order is the routing preference."""

    SERVING = 1
    DEGRADED = 2
    DRAINING = 3
    DOWN = 4


_ROUTABLE = (RegionHealth.SERVING, RegionHealth.DEGRADED)


@dataclass(frozen=True)
class GeoPoint:
    """A point on the globe, in degrees."""

    latitude: float
    longitude: float

    def distance_km(self, other: GeoPoint) -> float:
        """Great-circle distance (haversine)."""
        lat1, lat2 = math.radians(self.latitude), math.radians(other.latitude)
        dlat = lat2 - lat1
        dlon = math.radians(other.longitude - self.longitude)
        a = math.sin(dlat / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin(dlon / 2) ** 2
        return 2 * _EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(a)))


@dataclass(frozen=True)
class ModelPodCount:
    """How many of a region's engine pods serve one model."""

    model: str
    engine_pods: int
    healthy_engine_pods: int = 0


@dataclass(frozen=True)
class RegionReport:
    """What a region says about itself in a heartbeat."""

    region: str
    zone: str
    chat_address: str
    health: RegionHealth
    capacity: int = 0
    queue_depth: int = 0
    models: tuple[str, ...] = ()
    location: GeoPoint | None = None
    engine_pods: int = 0
    healthy_engine_pods: int = 0
    model_pods: tuple[ModelPodCount, ...] = ()
    """Pods per model; empty from a region that does not say (then every model counts all its pods)."""

    @property
    def load(self) -> float:
        """Waiting requests per unit of capacity; a region without capacity is full."""
        return self.queue_depth / self.capacity if self.capacity > 0 else math.inf

    def engine_pods_of(self, model: str) -> int:
        """The region's engine pods serving ``model``: as reported per model,
        else (a region that reports no per-model counts) all of them."""
        if not self.model_pods:
            return self.engine_pods
        return next((m.engine_pods for m in self.model_pods if m.model == model), 0)


@dataclass(frozen=True)
class RegionStatus:
    """A region as the directory sees it: its last report and the health it is given."""

    report: RegionReport
    last_heartbeat_time: datetime
    effective_health: RegionHealth


@dataclass(frozen=True)
class LocationHint:
    """A client's whereabouts: a region name, a point, or nothing."""

    region: str = ""
    point: GeoPoint | None = field(default=None)

    @classmethod
    def parse(cls, text: str) -> LocationHint:
        """``""``, a region name ("eu-west") or "lat,lon"; INVALID_ARGUMENT otherwise."""
        text = text.strip()
        if not text:
            return cls()
        if is_valid_name(text):
            return cls(region=text)
        lat_text, sep, lon_text = text.partition(",")
        try:
            point = GeoPoint(float(lat_text), float(lon_text)) if sep else None
        except ValueError:
            point = None
        if point is None or not (-90 <= point.latitude <= 90 and -180 <= point.longitude <= 180):
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"client_location_hint must be a region name or 'lat,lon' in degrees, got {text!r}",
                metadata={"param": "client_location_hint"},
            )
        return cls(point=point)


def _validate(report: RegionReport) -> None:
    if not is_valid_name(report.region):
        raise InvalidArgument(
            Reason.INVALID_REQUEST, f"invalid region name {report.region!r}", metadata={"param": "region"}
        )
    require_zone(report.zone)
    if not report.chat_address.strip():
        raise InvalidArgument(
            Reason.INVALID_REQUEST, "chat_address must be set", metadata={"param": "chat_address"}
        )
    for name in ("capacity", "queue_depth", "engine_pods", "healthy_engine_pods"):
        if getattr(report, name) < 0:
            raise InvalidArgument(Reason.INVALID_REQUEST, f"{name} must be >= 0", metadata={"param": name})
    _validate_model_pods(report)


def _validate_model_pods(report: RegionReport) -> None:
    seen: set[str] = set()
    for n, count in enumerate(report.model_pods):
        param = f"model_pods[{n}]"
        if not count.model.strip() or count.model in seen:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"{param}.model must name a model, once: got {count.model[:64]!r}",
                metadata={"param": f"{param}.model"},
            )
        seen.add(count.model)
        if not 0 <= count.healthy_engine_pods <= count.engine_pods <= report.engine_pods:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                f"{param}: need 0 <= healthy_engine_pods ({count.healthy_engine_pods}) <= engine_pods "
                f"({count.engine_pods}) <= the region's engine_pods ({report.engine_pods})",
                metadata={"param": param},
            )


class RegionDirectory:
    """Regions by name with their latest heartbeat.

    A region that misses ``missed_until_down`` heartbeat intervals is DOWN
    whatever it last said; routing never returns a region outside the
    tenant's zone. While the directory hears from no region at all for that
    long, it cannot tell dead regions from its own isolation (a partition of
    the global plane, a paused process coming back), so it keeps every
    region's last reported health until heartbeats arrive again, and then
    gives each region a full ``missed_until_down`` intervals to report in,
    rather than declare the whole mesh down at once.
    """

    def __init__(self, interval_ms: int = 1000, missed_until_down: int = 3, clock: Clock = utc_now) -> None:
        self.interval_ms = interval_ms
        self.missed_until_down = missed_until_down
        self._clock = clock
        self._regions: dict[str, tuple[RegionReport, datetime]] = {}
        # When the last heartbeat from any region arrived, and when the
        # directory began hearing again after a silence of every region.
        self._last_heard: datetime | None = None
        self._resumed: datetime | None = None
        # When the store's heartbeats were last merged in (:meth:`merge`).
        self._merged: datetime | None = None

    @property
    def down_after(self) -> timedelta:
        """Silence after which a region is DOWN."""
        return timedelta(milliseconds=self.interval_ms * self.missed_until_down)

    def heartbeat(self, report: RegionReport) -> None:
        """Record ``report``; a region may never move to another zone (``WRONG_ZONE``)."""
        _validate(report)
        known = self._regions.get(report.region)
        if known is not None and known[0].zone != report.zone:
            raise InvalidArgument(
                Reason.WRONG_ZONE,
                f"region {report.region!r} belongs to zone {known[0].zone!r}, not {report.zone!r}",
                metadata={"param": "zone", "region": report.region, "zone": known[0].zone},
            )
        now = self._clock()
        if self._last_heard is not None and now - self._last_heard >= self.down_after:
            self._resumed = now
        self._regions[report.region] = (report, now)
        self._last_heard = now

    def restore(self, heartbeats: Iterable[tuple[RegionReport, datetime]]) -> None:
        """Start from heartbeats kept before a restart (each report with its time).

        The directory was deaf from the newest of them until now, so every
        region has a full ``down_after`` from now (or from the first
        heartbeat, after a longer silence) to report in, and keeps its last
        reported health until then, as after any silence of the whole mesh.
        A region whose heartbeat was already ``down_after`` older than the
        newest was DOWN before the restart, and stays so until it reports
        again. Regions already known keep what they said since.
        """
        kept = [(report, seen) for report, seen in heartbeats if report.region not in self._regions]
        if not kept:
            return
        newest = max(seen for _, seen in kept)
        for report, seen in kept:
            if newest - seen >= self.down_after:
                report = replace(report, health=RegionHealth.DOWN)
            self._regions[report.region] = (report, seen)
        if self._last_heard is None or newest > self._last_heard:
            self._last_heard = newest
        self._resumed = self._clock()

    def merge(self, heartbeats: Iterable[tuple[RegionReport, datetime]], read_time: datetime) -> None:
        """Take in the heartbeats every replica keeps in the store, as read at ``read_time``.

        A stored heartbeat newer than the one the directory holds replaces
        it; each counts as hearing from the mesh, so a replica that no
        region dials is not deaf while its peers hear regions. A silence of
        the whole mesh that the previous read already showed ends at the
        first heartbeat any replica received after it; a gap between reads
        (the directory did not look) is no silence. A region missing from
        the store was removed (by any replica) and is forgotten, unless this
        replica heard it within an interval of ``read_time`` (a heartbeat
        still on its way into the store).
        """
        checked, self._merged = self._merged, read_time
        stored = {report.region: (report, seen) for report, seen in heartbeats}
        recent = read_time - timedelta(milliseconds=self.interval_ms)
        for name, (_, seen) in list(self._regions.items()):
            if name not in stored and seen < recent:
                del self._regions[name]
        for report, seen in sorted(stored.values(), key=lambda kept: kept[1]):
            known = self._regions.get(report.region)
            if known is not None and known[1] >= seen:
                continue
            if (
                checked is not None
                and self._last_heard is not None
                and checked - self._last_heard >= self.down_after
                and seen > checked
            ):
                self._resumed = seen
            self._regions[report.region] = (report, seen)
            if self._last_heard is None or seen > self._last_heard:
                self._last_heard = seen

    def remove(self, region: str) -> RegionStatus:
        """Forget ``region`` (a region taken out of service for good); its last status.

        NOT_FOUND ``REGION_NOT_FOUND`` for a region the directory does not
        know. A region that is still running comes back with its next
        heartbeat: stop it first.
        """
        if not is_valid_name(region):
            raise InvalidArgument(
                Reason.INVALID_REQUEST, f"invalid region name {region!r}", metadata={"param": "region"}
            )
        status = self.status(region)
        if status is None:
            raise NotFound(
                Reason.REGION_NOT_FOUND,
                f"no region {region!r} in the directory",
                metadata={"param": "region", "region": region},
            )
        del self._regions[region]
        return status

    def status(self, region: str) -> RegionStatus | None:
        """The region's status, or ``None`` if it never reported."""
        known = self._regions.get(region)
        if known is None:
            return None
        report, seen = known
        now = self._clock()
        deaf = self._last_heard is not None and now - self._last_heard >= self.down_after
        # Silence is counted from the end of the directory's own deafness:
        # every region gets a full down_after to report in again.
        since = max(seen, self._resumed) if self._resumed is not None else seen
        silent = now - since >= self.down_after and not deaf
        return RegionStatus(report, seen, RegionHealth.DOWN if silent else report.health)

    def list_regions(self, zone: str = "", page_size: int = 0, page_token: str = "") -> Page[RegionStatus]:
        """Regions ordered by name, optionally only those of ``zone``."""
        if zone:
            require_zone(zone)
        statuses = [s for s in self._statuses() if not zone or s.report.zone == zone]
        return paginate(statuses, lambda s: s.report.region, page_size, page_token, default_size=100)

    def zones(self) -> frozenset[str]:
        """The zones of every region the directory knows, whatever its health."""
        return frozenset(report.zone for report, _ in self._regions.values())

    def _require_served_in_zone(self, zone: str, model: str) -> None:
        """NOT_FOUND ``UNKNOWN_MODEL`` (param ``model``) when regions of
        ``zone`` have reported and none of them, in any health, serves
        ``model``: the zone does not deploy it, which no wait would change."""
        reports = [s.report for s in self._statuses() if s.report.zone == zone]
        if not reports or any(model in r.models for r in reports):
            return
        served = sorted({m for r in reports for m in r.models})
        raise NotFound(
            Reason.UNKNOWN_MODEL,
            f"model {model!r} is not served in zone {zone!r}; its regions serve "
            f"{', '.join(served) or 'no model'}",
            metadata={"param": "model", "zone": zone, "model": model},
        )

    def serving(self, model: str) -> list[RegionStatus]:
        """Routable regions (any zone) that report serving ``model``, by name."""
        return sorted(
            (s for s in self._statuses() if s.effective_health in _ROUTABLE and model in s.report.models),
            key=lambda s: s.report.region,
        )

    def route(
        self, zone: str, model: str = "", location_hint: str = "", preferred_region: str = ""
    ) -> list[RegionStatus]:
        """The regions to try for a tenant of ``zone``, best first; never empty.

        Only SERVING or DEGRADED regions of that zone that serve
        ``model`` (when given). Order: ``preferred_region``; the region the
        hint names, or nearest to the hint's point; SERVING before DEGRADED;
        lighter load. FAILED_PRECONDITION ``NO_REGION_IN_ZONE`` when none
        qualifies: a request is never sent to another zone instead.
        """
        hint = LocationHint.parse(location_hint)
        eligible = [
            s
            for s in self._statuses()
            if s.report.zone == zone
            and s.effective_health in _ROUTABLE
            and (not model or model in s.report.models)
        ]
        if not eligible and model:
            self._require_served_in_zone(zone, model)
        if not eligible:
            wanted = f" serving model {model!r}" if model else ""
            raise FailedPrecondition(
                Reason.NO_REGION_IN_ZONE,
                f"no healthy region{wanted} in zone {zone!r}; "
                "requests are never sent outside the tenant's zone",
                metadata={"zone": zone, **({"model": model} if model else {})},
            )

        def rank(status: RegionStatus) -> tuple[bool, bool, float, int, float, str]:
            report = status.report
            distance = 0.0
            if hint.point is not None:
                distance = report.location.distance_km(hint.point) if report.location else math.inf
            return (
                report.region != preferred_region,
                report.region != hint.region,
                distance,
                status.effective_health,
                report.load,
                report.region,
            )

        return sorted(eligible, key=rank)

    def _statuses(self) -> Sequence[RegionStatus]:
        return [s for name in self._regions if (s := self.status(name)) is not None]

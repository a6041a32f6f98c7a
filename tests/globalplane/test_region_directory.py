from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.core.errors import FailedPrecondition, InvalidArgument, NotFound, Reason
from llmmesh.globalplane.region_directory import (
    GeoPoint,
    LocationHint,
    ModelPodCount,
    RegionDirectory,
    RegionHealth,
    RegionReport,
)
from tests.globalplane.manual_clock import ManualClock

PARIS = GeoPoint(48.86, 2.35)
FRANKFURT = GeoPoint(50.11, 8.68)
DUBLIN = GeoPoint(53.35, -6.26)


def _report(
    region: str,
    zone: str = "eu",
    health: RegionHealth = RegionHealth.SERVING,
    *,
    queue_depth: int = 0,
    location: GeoPoint | None = None,
    models: tuple[str, ...] = ("m",),
) -> RegionReport:
    return RegionReport(region, zone, f"{region}:443", health, 8, queue_depth, models, location, 2, 2)


def _per_model(*counts: ModelPodCount) -> RegionReport:
    """A region of two pods reporting ``counts`` per model."""
    return RegionReport("eu-west", "eu", "a:1", RegionHealth.SERVING, engine_pods=2, model_pods=counts)


def _names(directory: RegionDirectory, **kw: str) -> list[str]:
    return [s.report.region for s in directory.route("eu", **kw)]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def directory(clock: ManualClock) -> RegionDirectory:
    d = RegionDirectory(interval_ms=1000, missed_until_down=3, clock=clock)
    d.heartbeat(_report("eu-west", location=DUBLIN, queue_depth=4))
    d.heartbeat(_report("eu-central", location=FRANKFURT, queue_depth=1))
    d.heartbeat(_report("us-east", zone="us"))
    return d


def test_route_stays_in_zone_and_prefers_light_load(directory: RegionDirectory) -> None:
    assert _names(directory) == ["eu-central", "eu-west"]


def test_preferred_region_comes_first_only_if_eligible(directory: RegionDirectory) -> None:
    assert _names(directory, preferred_region="eu-west") == ["eu-west", "eu-central"]
    # Another zone's region is never returned, not even when preferred.
    assert _names(directory, preferred_region="us-east") == ["eu-central", "eu-west"]


def test_hint_naming_a_region_puts_it_first(directory: RegionDirectory) -> None:
    assert _names(directory, location_hint="eu-west") == ["eu-west", "eu-central"]
    assert _names(directory, location_hint="eu-west", preferred_region="eu-central")[0] == "eu-central"


def test_point_hint_orders_by_distance(directory: RegionDirectory) -> None:
    assert _names(directory, location_hint=f"{PARIS.latitude},{PARIS.longitude}") == ["eu-central", "eu-west"]
    assert _names(directory, location_hint="52.0,-8.0") == ["eu-west", "eu-central"]


@pytest.mark.parametrize("hint", ["91,0", "0,181", "1,2,3", "abc def", "EU-WEST", "1;2"])
def test_malformed_hint_is_invalid(hint: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        LocationHint.parse(hint)
    assert info.value.metadata["param"] == "client_location_hint"


def test_serving_before_degraded_and_draining_excluded(directory: RegionDirectory) -> None:
    directory.heartbeat(_report("eu-central", health=RegionHealth.DEGRADED))
    directory.heartbeat(_report("eu-north", health=RegionHealth.DRAINING))
    assert _names(directory) == ["eu-west", "eu-central"]


def test_model_filter(directory: RegionDirectory) -> None:
    directory.heartbeat(_report("eu-south", models=("big",)))
    assert _names(directory, model="big") == ["eu-south"]
    # The zone's regions deploy no such model: no wait would change that.
    with pytest.raises(NotFound) as unknown:
        directory.route("eu", model="none")
    assert (unknown.value.reason, unknown.value.metadata["param"]) == (Reason.UNKNOWN_MODEL, "model")
    assert "model 'none' is not served in zone 'eu'; its regions serve big" in unknown.value.message
    # A zone without a region serving now is a residency refusal, model or not.
    with pytest.raises(FailedPrecondition) as info:
        directory.route("mars", model="big")
    assert info.value.reason == Reason.NO_REGION_IN_ZONE
    assert info.value.metadata["zone"] == "mars"


def test_missed_heartbeats_mark_a_region_down(directory: RegionDirectory, clock: ManualClock) -> None:
    clock.advance(milliseconds=2999)
    directory.heartbeat(_report("eu-central", location=FRANKFURT))
    status = directory.status("eu-west")
    assert status is not None
    assert status.effective_health == RegionHealth.SERVING
    clock.advance(milliseconds=1)
    status = directory.status("eu-west")
    assert status is not None
    assert status.effective_health == RegionHealth.DOWN
    assert _names(directory) == ["eu-central"]
    # The eu regions fall silent while the directory still hears from us-east.
    for _ in range(3):
        clock.advance(seconds=1)
        directory.heartbeat(_report("us-east", zone="us"))
    with pytest.raises(FailedPrecondition) as info:
        directory.route("eu")
    assert info.value.reason == Reason.NO_REGION_IN_ZONE
    assert "zone 'eu'" in info.value.message


def test_a_directory_that_hears_from_no_region_keeps_their_last_health(
    directory: RegionDirectory, clock: ManualClock
) -> None:
    # The global plane was cut off (or paused): every region is silent at once.
    clock.advance(seconds=60)
    assert _names(directory) == ["eu-central", "eu-west"]
    # Heartbeats resume: every region gets a full down_after to report in.
    directory.heartbeat(_report("eu-central", location=FRANKFURT))
    assert _names(directory) == ["eu-central", "eu-west"]
    clock.advance(milliseconds=2999)
    directory.heartbeat(_report("eu-central", location=FRANKFURT))
    assert _names(directory) == ["eu-central", "eu-west"]
    clock.advance(milliseconds=1)
    assert _names(directory) == ["eu-central"]
    status = directory.status("us-east")
    assert status is not None and status.effective_health == RegionHealth.DOWN


def test_a_region_never_changes_zone(directory: RegionDirectory) -> None:
    with pytest.raises(InvalidArgument) as info:
        directory.heartbeat(_report("eu-west", zone="us"))
    assert info.value.reason == Reason.WRONG_ZONE


@pytest.mark.parametrize(
    ("report", "param"),
    [
        (_report("EU_WEST"), "region"),
        (_report("eu-west", zone="eu-x"), "zone"),
        (RegionReport("eu-west", "eu", " ", RegionHealth.SERVING), "chat_address"),
        (RegionReport("eu-west", "eu", "a:1", RegionHealth.SERVING, capacity=-1), "capacity"),
        (_per_model(ModelPodCount("", 1, 1)), "model_pods[0].model"),
        (_per_model(ModelPodCount("m", 1, 1), ModelPodCount("m", 1, 1)), "model_pods[1].model"),
        (_per_model(ModelPodCount("m", 1, 2)), "model_pods[0]"),
        (_per_model(ModelPodCount("m", 3, 1)), "model_pods[0]"),
        (_per_model(ModelPodCount("m", -1, 0)), "model_pods[0]"),
    ],
)
def test_heartbeat_validates(report: RegionReport, param: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        RegionDirectory().heartbeat(report)
    assert info.value.metadata["param"] == param


def test_list_regions_pages_and_filters(directory: RegionDirectory) -> None:
    first = directory.list_regions(zone="eu", page_size=1)
    second = directory.list_regions(zone="eu", page_size=1, page_token=first.next_page_token)
    assert [s.report.region for s in first.items + second.items] == ["eu-central", "eu-west"]
    assert second.next_page_token == ""
    assert [s.report.region for s in directory.serving("m")] == ["eu-central", "eu-west", "us-east"]


_ZONES = ["eu", "us", "ap"]
_regions = st.lists(
    st.tuples(
        st.sampled_from(_ZONES),
        st.integers(0, 5),
        st.sampled_from(list(RegionHealth)),
        st.integers(0, 10),
        st.integers(0, 4000),
        st.booleans(),
    ),
    max_size=12,
)


@given(
    regions=_regions,
    zone=st.sampled_from(_ZONES),
    preferred=st.sampled_from(["", "eu-r1", "us-r2", "ap-r3"]),
    hint=st.sampled_from(["", "us-r1", "eu-r0", "10.5,20.25", "-45,170"]),
)
def test_property_route_never_leaves_the_zone(
    regions: list[tuple[str, int, RegionHealth, int, int, bool]], zone: str, preferred: str, hint: str
) -> None:
    clock = ManualClock()
    directory = RegionDirectory(clock=clock)
    for region_zone, number, health, queue, silent_ms, located in regions:
        name = f"{region_zone}-r{number}"
        known = directory.status(name)
        if known is not None and known.report.zone != region_zone:
            continue
        location = GeoPoint(number * 10.0, number * -20.0) if located else None
        directory.heartbeat(RegionReport(name, region_zone, "h:1", health, 4, queue, ("m",), location))
        clock.advance(milliseconds=silent_ms)
    expected = {
        s.report.region
        for s in directory.list_regions(zone=zone, page_size=500).items
        if s.effective_health in (RegionHealth.SERVING, RegionHealth.DEGRADED)
    }
    if not expected:
        with pytest.raises(FailedPrecondition) as info:
            directory.route(zone, model="m", location_hint=hint, preferred_region=preferred)
        assert info.value.reason == Reason.NO_REGION_IN_ZONE
        return
    routed = directory.route(zone, model="m", location_hint=hint, preferred_region=preferred)
    names = [s.report.region for s in routed]
    assert all(s.report.zone == zone for s in routed)
    assert set(names) == expected
    assert len(names) == len(set(names))
    if preferred in expected:
        assert names[0] == preferred


def _heartbeats(directory: RegionDirectory) -> list[tuple[RegionReport, datetime]]:
    return [(s.report, s.last_heartbeat_time) for s in directory.list_regions().items]


def test_a_restarted_directory_routes_at_once_on_the_kept_heartbeats(
    directory: RegionDirectory, clock: ManualClock
) -> None:
    kept = _heartbeats(directory)
    # The restart took longer than the heartbeat timeout; nothing has reported since.
    clock.advance(seconds=10)
    restarted = RegionDirectory(interval_ms=1000, missed_until_down=3, clock=clock)
    with pytest.raises(FailedPrecondition):
        restarted.route("eu")
    restarted.restore(kept)
    assert _names(restarted) == ["eu-central", "eu-west"]
    # The first heartbeat after the restart gives the others a full timeout to report in.
    restarted.heartbeat(_report("eu-central", location=FRANKFURT))
    clock.advance(seconds=2.5)
    assert _names(restarted) == ["eu-central", "eu-west"]
    restarted.heartbeat(_report("eu-central", location=FRANKFURT))
    clock.advance(seconds=1)
    assert _names(restarted) == ["eu-central"]


def test_staleness_is_judged_by_heartbeat_age_across_a_restart(
    directory: RegionDirectory, clock: ManualClock
) -> None:
    # eu-west fell silent well before the global plane went down.
    clock.advance(seconds=5)
    directory.heartbeat(_report("eu-central", location=FRANKFURT))
    directory.heartbeat(_report("us-east", zone="us"))
    kept = _heartbeats(directory)
    restarted = RegionDirectory(interval_ms=1000, missed_until_down=3, clock=clock)
    restarted.restore(kept)
    assert _names(restarted) == ["eu-central"]
    assert restarted.status("eu-west") is not None
    assert restarted.status("eu-west").effective_health is RegionHealth.DOWN  # type: ignore[union-attr]
    # What a region reported after the restart is not overwritten by what was kept.
    restarted.heartbeat(_report("eu-central", health=RegionHealth.DRAINING))
    restarted.restore(kept)
    assert restarted.status("eu-central").report.health is RegionHealth.DRAINING  # type: ignore[union-attr]


def test_a_removed_region_is_forgotten_until_it_reports_again(directory: RegionDirectory) -> None:
    removed = directory.remove("eu-west")
    assert removed.report.region == "eu-west" and removed.effective_health is RegionHealth.SERVING
    assert _names(directory) == ["eu-central"]
    assert "eu-west" not in [s.report.region for s in directory.list_regions().items]
    with pytest.raises(NotFound) as missing:
        directory.remove("eu-west")
    assert missing.value.reason == Reason.REGION_NOT_FOUND
    with pytest.raises(InvalidArgument):
        directory.remove("")
    directory.heartbeat(_report("eu-west"))
    assert set(_names(directory)) == {"eu-central", "eu-west"}


def test_regions_silent_only_while_the_global_plane_was_down_stay_routable(clock: ManualClock) -> None:
    directory = RegionDirectory(interval_ms=1000, missed_until_down=3, clock=clock)
    directory.heartbeat(_report("eu-west"))
    clock.advance(seconds=2)
    directory.heartbeat(_report("eu-central"))
    kept = _heartbeats(directory)
    # Killed now, serving again 1.5 s later: eu-west's last heartbeat is 3.5 s old.
    clock.advance(seconds=1.5)
    restarted = RegionDirectory(interval_ms=1000, missed_until_down=3, clock=clock)
    restarted.restore(kept)
    assert set(_names(restarted)) == {"eu-central", "eu-west"}
    # The first heartbeat comes 2.9 s after the restart: eu-west has 3 s from it.
    clock.advance(seconds=2.9)
    restarted.heartbeat(_report("eu-central"))
    clock.advance(seconds=2.9)
    restarted.heartbeat(_report("eu-central"))
    assert set(_names(restarted)) == {"eu-central", "eu-west"}
    clock.advance(seconds=0.2)
    assert _names(restarted) == ["eu-central"]


def test_pods_of_a_model_are_as_reported_else_the_region_s_total() -> None:
    counts = (ModelPodCount("small", 2, 1), ModelPodCount("large", 1, 1))
    report = RegionReport("eu-west", "eu", "a:1", RegionHealth.SERVING, engine_pods=3, model_pods=counts)
    RegionDirectory().heartbeat(report)
    assert (report.engine_pods_of("small"), report.engine_pods_of("large")) == (2, 1)
    assert report.engine_pods_of("other") == 0
    # A region that does not count per model (an older one) runs every model on all its pods.
    assert _report("eu-central").engine_pods_of("m") == 2


def test_merged_heartbeats_of_other_replicas_count_and_a_silence_of_the_whole_mesh_is_forgiven() -> None:
    clock = ManualClock()
    directory = RegionDirectory(interval_ms=1000, missed_until_down=3, clock=clock)
    start = clock()
    directory.merge([(_report("us-east"), start), (_report("us-west"), start)], start)
    assert _health(directory) == {"us-east": RegionHealth.SERVING, "us-west": RegionHealth.SERVING}
    # No replica hears any region: every replica keeps what regions last said.
    clock.advance(seconds=5)
    directory.merge([(_report("us-east"), start), (_report("us-west"), start)], clock())
    assert _health(directory) == {"us-east": RegionHealth.SERVING, "us-west": RegionHealth.SERVING}
    # Hearing resumes (at another replica): us-west gets a full down_after from then.
    clock.advance(seconds=1)
    resumed = clock()
    directory.merge([(_report("us-east"), resumed), (_report("us-west"), start)], resumed)
    clock.advance(seconds=2.5)
    directory.merge([(_report("us-east"), clock()), (_report("us-west"), start)], clock())
    assert _health(directory)["us-west"] == RegionHealth.SERVING
    clock.advance(seconds=0.5)
    directory.merge([(_report("us-east"), clock()), (_report("us-west"), start)], clock())
    assert _health(directory) == {"us-east": RegionHealth.SERVING, "us-west": RegionHealth.DOWN}


def test_a_region_removed_at_another_replica_is_forgotten_unless_just_heard() -> None:
    clock = ManualClock()
    directory = RegionDirectory(interval_ms=1000, missed_until_down=3, clock=clock)
    directory.merge([(_report("us-east"), clock())], clock())
    clock.advance(seconds=0.5)
    directory.heartbeat(_report("us-west"))
    # us-west's heartbeat is not in the store yet; us-east was removed there.
    clock.advance(seconds=1)
    directory.merge([], clock())
    assert _health(directory) == {"us-west": RegionHealth.SERVING}


def _health(directory: RegionDirectory) -> dict[str, RegionHealth]:
    return {s.report.region: s.effective_health for s in directory.list_regions().items}

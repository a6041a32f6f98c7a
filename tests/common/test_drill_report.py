"""The drill's figures from hand-made turn records: token faults, affected
turns and stalls, residency, routing times and the verdict."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import grpc.aio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmmesh.client import MeshTls
from llmmesh.core.identity import PlaneIdentity, Role
from llmmesh.core.mtls import MeshSecurity, holder_security
from llmmesh.drill.plan import DrillPlan
from llmmesh.drill.report import (
    Timeline,
    affected_turns,
    billing_checked_turns,
    build_report,
    percentile,
    residency,
    sequence_faults,
    stall_of,
    tally_tokens,
)
from llmmesh.drill.rotation import RotationTally
from llmmesh.drill.routing_watch import RoutingSample, RoutingWatch
from llmmesh.drill.setup import DrillInputError, DrillSetup, tls_servers
from llmmesh.drill.sse_turn import Outcome, TurnRecord
from llmmesh.drill.target import ListedRegion, MeshTarget, PodRef, TargetError, TenantKey
from llmmesh.drill.usage import UsageCheck
from llmmesh.topology.mesh_certs import ensure_mesh_certs

ZONES = {"us-east": "us", "us-west": "us", "eu-west": "eu"}
TIMELINE = Timeline(started=0.0, disrupted=10.0, restored=20.0, traffic_ended=40.0)


def turn(
    stream: int,
    sent: float,
    ended: float,
    *,
    region: str = "us-east",
    outcome: Outcome = Outcome.DONE,
    tokens: int | None = 8,
    ids: Sequence[int] = (1, 2, 3),
    events: Sequence[float] = (),
    request_id: str = "",
) -> TurnRecord:
    record = TurnRecord(stream, 0, "us", sent, status=200, region=region, headers_at=sent + 0.1)
    record.outcome, record.ended_at, record.received_tokens = outcome, ended, tokens
    record.content_ids = list(ids)
    record.event_times = list(events)
    record.request_id = request_id or f"chatcmpl-{stream}-{sent}"
    record.finish_reason = "length" if outcome is Outcome.DONE else ""
    return record


def never_dialled() -> grpc.aio.Channel:
    raise AssertionError("the report reads samples, it dials nothing")


def watch(*samples: tuple[float, frozenset[str] | None]) -> RoutingWatch:
    routing = RoutingWatch(never_dialled, "tenant", 0.25)
    routing.samples = [RoutingSample(at, regions) for at, regions in samples]
    return routing


def test_sequence_faults_count_missing_and_repeated_ids() -> None:
    assert sequence_faults([1, 2, 3]) == (0, 0)
    assert sequence_faults([1, 4, 5]) == (2, 0)
    assert sequence_faults([1, 2, 2, 3, 1]) == (0, 2)
    assert sequence_faults([]) == (0, 0)


@given(st.lists(st.integers(min_value=1, max_value=50), max_size=40))
def test_sequence_faults_account_for_every_id(ids: list[int]) -> None:
    missing, repeated = sequence_faults(ids)
    distinct_rising = len(ids) - repeated
    assert missing + distinct_rising == (max(ids) if ids else 0)


def test_percentiles_by_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(v) for v in range(1, 101)], 99) == 99.0
    assert percentile([5.0], 99) == 5.0


def test_done_turns_are_checked_against_max_tokens_others_by_sequence() -> None:
    records = [
        turn(0, 0, 1, tokens=8),
        turn(1, 0, 1, tokens=6),  # two lost
        turn(2, 0, 1, tokens=11),  # three duplicated
        turn(3, 0, 1, outcome=Outcome.FAILED_CLEARLY, tokens=3, ids=(1, 3, 3, 4)),
        turn(4, 0, 1, tokens=None),
    ]
    tally = tally_tokens(records, expected=8)
    assert (tally.lost, tally.duplicated) == (2 + 1, 3 + 1)
    assert (tally.gaps, tally.repeats, tally.uncounted) == (1, 1, 1)
    assert tally.received == 8 + 6 + 11 + 3


def test_a_region_drill_affects_the_turns_running_there_at_the_disruption() -> None:
    plan = DrillPlan(kind="region")
    running = turn(0, 9.0, 12.0)
    records = [running, turn(1, 9.0, 12.0, region="us-west"), turn(2, 5.0, 9.5), turn(3, 10.5, 12.0)]
    assert affected_turns(plan, "us-east", TIMELINE, records) == [running]


def test_a_global_plane_drill_affects_every_turn_of_the_outage() -> None:
    plan = DrillPlan(kind="global-plane", mode="partition")
    records = [
        turn(0, 9.0, 11.0, region="us-west"),
        turn(1, 15.0, 16.0),
        turn(2, 1.0, 2.0),
        turn(3, 21.0, 22.0),
    ]
    assert [r.stream for r in affected_turns(plan, "", TIMELINE, records)] == [0, 1]


def test_the_stall_is_the_longest_gap_ending_after_the_disruption() -> None:
    record = turn(0, 8.0, 14.2, events=[8.2, 9.9, 13.4, 14.0, 14.2])
    # sent 8.0, headers 8.1, events …, 9.9 -> 13.4 straddles the disruption at 10.
    assert stall_of(record, 10.0) == pytest.approx(3.5)
    lost = turn(1, 8.0, 70.0, outcome=Outcome.LOST, events=[8.2, 9.9])
    assert stall_of(lost, 10.0) == pytest.approx(60.1)


def test_residency_names_each_turn_outside_its_zone() -> None:
    records = [turn(0, 0, 1), turn(1, 0, 1, region="eu-west"), turn(2, 0, 1, region="")]
    held = residency(records, ZONES)
    assert held["held"] is False and held["violations"] == 1 and held["turns_checked"] == 2
    assert residency(records[:1], ZONES)["held"] is True


def test_billing_is_checked_for_unaffected_turns_finished_in_the_window() -> None:
    plan = DrillPlan(kind="region")
    records = [
        turn(0, 9.0, 12.0),  # affected: continued elsewhere, billed under another id maybe
        turn(1, 11.0, 12.0, region="us-west"),
        turn(2, 1.0, 2.0),  # before the window
        turn(3, 11.0, 12.0, region="us-west", outcome=Outcome.FAILED_CLEARLY),
    ]
    assert [r.stream for r in billing_checked_turns(plan, "us-east", TIMELINE, records)] == [1]


def test_the_report_of_a_clean_failover_passes() -> None:
    plan = DrillPlan(kind="region", streams=2, max_tokens=8)
    records = [
        turn(0, 1.0, 2.0, events=[1.2, 1.5, 2.0]),
        turn(0, 9.0, 12.0, events=[9.5, 11.0, 12.0]),
        turn(1, 9.5, 12.0, region="us-west", events=[10.0, 12.0]),
        turn(1, 21.0, 22.0, events=[21.5, 22.0]),
    ]
    routing = watch((9.0, frozenset(ZONES)), (13.0, frozenset({"us-west"})), (20.5, frozenset({"us-east"})))
    usage = UsageCheck(32, 32, True, 1.0, 0)
    report = build_report(
        plan=plan,
        region="us-east",
        target="us-east (pid 1)",
        timeline=TIMELINE,
        records=records,
        routing=routing,
        region_zones=ZONES,
        token_source="tokenizer",
        usage=usage,
    )
    assert report["streams_affected"] == 1 and report["turns_affected"] == 1
    assert (report["tokens_lost"], report["tokens_duplicated"], report["turns_lost"]) == (0, 0, 0)
    assert report["stall_p99_s"] == pytest.approx(1.5)
    assert report["time_to_exclude_s"] == pytest.approx(3.0)
    # Listed again at 20.5, a turn started there at 21.1.
    assert report["time_to_return_s"] == pytest.approx(1.1)
    assert report["passed"] is True
    assert "turns_on_region_while_excluded" not in report  # a figure of kind partition-global only
    assert report["outage_s"] == pytest.approx(10.0) and report["disruption_took_s"] is None
    # A link taken down by a command that returned 2.5 s after it began: the
    # turn in flight when it began is affected though it ended before that.
    slow = Timeline(started=0.0, disrupted=10.0, restored=20.0, traffic_ended=40.0, applied=12.5)
    ended_meanwhile = turn(0, 9.0, 11.0, events=[9.5, 11.0])
    report = build_report(
        plan=plan, region="us-east", target="us-east (host 10.0.0.4, link lm0)", timeline=slow,
        records=[ended_meanwhile], routing=routing, region_zones=ZONES, token_source="tokenizer", usage=usage,
    )  # fmt: skip
    assert report["disruption_took_s"] == pytest.approx(2.5)
    assert report["streams_affected"] == report["turns_affected"] == 1
    lossy = build_report(
        plan=plan,
        region="us-east",
        target="",
        timeline=TIMELINE,
        records=[*records, turn(0, 30.0, 31.0, tokens=7)],
        routing=routing,
        region_zones=ZONES,
        token_source="tokenizer",
        usage=usage,
    )
    assert lossy["tokens_lost"] == 1 and lossy["passed"] is False


def test_billing_must_match_what_the_clients_received_exactly() -> None:
    # A turn the mesh failed after 3 tokens: billed those 3 with the 8 of a whole turn.
    plan = DrillPlan(kind="region", streams=1, max_tokens=8)
    records = [turn(0, 9.0, 12.0), turn(0, 12.0, 13.0, outcome=Outcome.FAILED_CLEARLY, tokens=3)]

    def verdict(usage: UsageCheck, source: str = "tokenizer") -> tuple[object, object]:
        report = build_report(
            plan=plan, region="us-east", target="us-east (pid 1)", timeline=TIMELINE, records=records,
            routing=watch(), region_zones=ZONES, token_source=source, usage=usage,
        )  # fmt: skip
        exact = report["usage"]["exact"]  # type: ignore[index]
        return exact, report["passed"]

    assert verdict(UsageCheck(11, 11, True, 1.0, 0)) == (True, True)
    # Billed what the failed turn generated past what reached its client, or less than it received.
    assert verdict(UsageCheck(16, 11, True, 1.0, 0)) == (False, False)
    assert verdict(UsageCheck(8, 11, False, 30.0, 0)) == (False, False)
    # Unknown either side: not a verdict on billing.
    assert verdict(UsageCheck(None, 11, False, 30.0, None)) == (None, True)
    records[1].received_tokens = None
    assert verdict(UsageCheck(16, 8, True, 1.0, 0), "usage")[0] is None


def partition_global_report(
    records: list[TurnRecord], routing: RoutingWatch | None = None
) -> dict[str, object]:
    """The report of a drill in which geo-routing (unless ``routing`` says
    otherwise) left us-east out from 13 s and listed it again at 21 s."""
    if routing is None:
        routing = watch((9.0, frozenset(ZONES)), (13.0, frozenset({"us-west"})), (21.0, frozenset(ZONES)))
    return build_report(
        plan=DrillPlan(kind="partition-global", mode="partition", streams=2, max_tokens=8), region="us-east",
        target="us-east from global", timeline=TIMELINE, records=records, routing=routing, region_zones=ZONES,
        token_source="tokenizer", usage=UsageCheck(24, 24, True, 1.0, 0),
    )  # fmt: skip


def test_a_region_cut_off_from_the_global_plane_must_keep_serving_its_zone() -> None:
    steady = [turn(0, 9.0, 11.0), turn(1, 9.0, 14.0, region="us-west"), turn(1, 22.0, 23.0)]
    # Left out for 8 s: the turns sent in its second half, from 17 s, count.
    kept = partition_global_report([*steady, turn(0, 17.5, 18.0), turn(0, 18.5, 19.0)])
    assert kept["excluded_s"] == pytest.approx(8.0) and kept["turns_on_region_while_excluded"] == 2
    assert kept["time_to_exclude_s"] == pytest.approx(3.0) and kept["passed"] is True
    # Early on, a route remembered from before may still send turns there; later, none went.
    dropped = partition_global_report([*steady, turn(0, 14.0, 16.0), turn(0, 17.5, 18.0, region="us-west")])
    assert dropped["turns_on_region_while_excluded"] == 0 and dropped["passed"] is False
    # A partition from the global plane alone must fail no turn, even clearly.
    failed = turn(1, 15.0, 15.5, region="us-west", outcome=Outcome.FAILED_CLEARLY, tokens=None)
    assert partition_global_report([*steady, turn(0, 17.5, 18.0), failed])["passed"] is False
    # Never left out (a partition shorter than the heartbeat timeout): nothing to hold it to.
    never = partition_global_report(steady, watch((13.0, frozenset(ZONES))))
    assert never["excluded_s"] is None and never["turns_on_region_while_excluded"] is None
    assert never["passed"] is True


def test_plans_refuse_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="kind"):
        DrillPlan(kind="edge")
    with pytest.raises(ValueError, match="mode"):
        DrillPlan(mode="unplug")
    with pytest.raises(ValueError, match="streams"):
        DrillPlan(streams=0)
    assert DrillPlan(kind="global-plane", outage_s=5).partition_s == 5
    with pytest.raises(ValueError, match="cert-rotation and ca-rotation go with mode rotate"):
        DrillPlan(kind="cert-rotation")
    with pytest.raises(ValueError, match="cert-rotation and ca-rotation go with mode rotate"):
        DrillPlan(kind="region", mode="rotate")
    with pytest.raises(ValueError, match="cert-rotation and ca-rotation go with mode rotate"):
        DrillPlan(kind="ca-rotation")
    with pytest.raises(ValueError, match="ca-rotation needs rotate_every_s of at least 2"):
        DrillPlan(kind="ca-rotation", mode="rotate", rotate_every_s=1)
    # Three steps: the new CA trusted, every certificate re-issued, the old CA retired.
    assert DrillPlan(kind="ca-rotation", mode="rotate", rotate_every_s=3).partition_s == 6
    with pytest.raises(ValueError, match="rotations"):
        DrillPlan(kind="cert-rotation", mode="rotate", rotations=0)
    # The rounds run from the disruption on; the last ends the rotation.
    assert DrillPlan(kind="cert-rotation", mode="rotate", rotations=3, rotate_every_s=4).partition_s == 8


ROTATION = DrillPlan(kind="cert-rotation", mode="rotate", streams=2, max_tokens=8, rotations=2)


def rotation_report(records: list[TurnRecord], tally: RotationTally | None) -> dict[str, object]:
    return build_report(
        plan=ROTATION,
        region="",
        target="every certificate in /certs",
        timeline=TIMELINE,
        records=records,
        routing=watch((9.0, frozenset(ZONES))),
        region_zones=ZONES,
        token_source="tokenizer",
        usage=UsageCheck(24, 24, True, 1.0, 0),
        rotation=tally,
    )


def test_a_rotation_passes_only_if_no_turn_failed_and_every_server_serves_the_new_certificate() -> None:
    records = [turn(0, 9.0, 12.0), turn(1, 15.0, 19.0, region="us-west"), turn(0, 21.0, 22.0)]
    servers = ("global", "region us-east", "region us-west", "pod us-east-pod-0")
    clean = rotation_report(records, RotationTally(2, 26, servers))
    assert clean["passed"] is True
    assert (clean["cert_rotations"], clean["certificates_rotated"]) == (2, 26)
    assert (clean["servers_checked"], clean["servers_presenting_new_cert"]) == (4, 4)
    assert clean["servers_not_presenting_new_cert"] == []
    assert clean["turns_affected"] == 2 and clean["time_to_return_s"] == pytest.approx(1.1)
    stale = rotation_report(records, RotationTally(2, 26, servers, {"region us-west": "round 2: old serial"}))
    assert stale["servers_presenting_new_cert"] == 3 and stale["passed"] is False
    assert stale["servers_not_presenting_new_cert"] == [
        {"server": "region us-west", "why": "round 2: old serial"}
    ]
    failed = turn(1, 15.0, 16.0, outcome=Outcome.FAILED_CLEARLY, tokens=None)
    assert rotation_report([*records, failed], RotationTally(2, 26, servers))["passed"] is False
    assert rotation_report(records, RotationTally(1, 13, servers))["passed"] is False  # a round short
    assert rotation_report(records, None)["passed"] is False
    # The figures belong to this kind only.
    assert "servers_checked" not in build_report(
        plan=DrillPlan(kind="redis"), region="", target="", timeline=TIMELINE, records=records,
        routing=watch(), region_zones=ZONES, token_source="tokenizer", usage=UsageCheck(24, 24, True, 1.0, 0),
    )  # fmt: skip


def test_a_rotation_checks_the_global_plane_every_region_and_every_pod() -> None:
    target = MeshTarget(
        "http://edge", "127.0.0.1:9", {"us": "sk"}, "sk", MeshSecurity.insecure(),
        region_zones={"us-east": "us"}, region_addresses={"us-east": "127.0.0.1:10"},
        pods={"us-east": (PodRef("us-east-pod-0", "127.0.0.1:11"),)},
    )  # fmt: skip
    listed = {"us-east": ListedRegion("us", "10.0.0.1:1"), "eu-west": ListedRegion("eu", "10.0.0.2:1")}
    servers = [(s.name, s.address, s.server_name) for s in tls_servers(target, listed)]
    assert servers == [
        ("global", "127.0.0.1:9", "global.llmmesh"),
        ("region eu-west", "10.0.0.2:1", "eu-west.eu.region.llmmesh"),
        ("region us-east", "127.0.0.1:10", "us-east.us.region.llmmesh"),
        ("pod us-east-pod-0", "127.0.0.1:11", "us-east.us.engine.llmmesh"),
    ]


@pytest.mark.asyncio
async def test_an_unnamed_region_is_the_one_running_most_turns_at_the_disruption() -> None:
    target = MeshTarget("http://edge", "127.0.0.1:1", {"us": "sk"}, "sk", MeshSecurity.insecure())
    key = TenantKey("sk", "tenant", "us")
    setup = DrillSetup(DrillPlan(kind="region"), target, (key,), ZONES)
    assert setup.zone_regions() == ["us-east", "us-west"]
    in_flight = [turn(0, 1, 2, region="us-west"), turn(1, 1, 2), turn(2, 1, 2, region="us-west")]
    assert await setup.choose_region(lambda: in_flight) == "us-west"
    named = DrillSetup(DrillPlan(kind="region", region="us-east"), target, (key,), ZONES, "us-east")
    assert await named.choose_region(lambda: in_flight) == "us-east"
    redis = DrillSetup(DrillPlan(kind="redis"), target, (key,), ZONES)
    assert await redis.choose_region(lambda: in_flight) == ""


@pytest.mark.asyncio
async def test_a_region_is_chosen_when_a_turn_in_flight_is_accepted_not_before() -> None:
    # Streams whose turns ended together are all waiting for their next
    # acceptance: geo-routing's first (the idler region, by load) is not
    # where they run, so the choice waits (geo-routing at port 1 answers no one).
    target = MeshTarget("http://edge", "127.0.0.1:1", {"us": "sk"}, "sk", MeshSecurity.insecure())
    setup = DrillSetup(DrillPlan(kind="region"), target, (TenantKey("sk", "tenant", "us"),), ZONES)
    waiting = [turn(0, 1, 2, region=""), turn(1, 1, 2, region="")]
    asyncio.get_running_loop().call_later(0.1, setattr, waiting[1], "region", "us-west")
    assert await setup.choose_region(lambda: waiting) == "us-west"
    with pytest.raises(TargetError, match="geo-routing"):
        await setup.choose_region(lambda: [turn(2, 1, 2, region="")], wait_s=0.05)


class ScriptedLoads(DrillSetup):
    """A drill setup whose pods answer GetLoad from a script, one answer per look."""

    def __init__(self, answers: list[dict[str, int]]) -> None:
        pods = {"us-east": (PodRef("pod-a", "127.0.0.1:11"), PodRef("pod-b", "127.0.0.1:12"))}
        target = MeshTarget(
            "http://edge", "127.0.0.1:1", {"us": "sk"}, "sk", MeshSecurity.insecure(), pods=pods
        )
        super().__init__(DrillPlan(kind="pod"), target, (TenantKey("sk", "tenant", "us"),), ZONES)
        self.answers, self.looks = answers, 0

    async def pod_loads(self, region: str) -> dict[str, int]:
        self.looks += 1
        return self.answers[min(self.looks, len(self.answers)) - 1]


@pytest.mark.asyncio
async def test_the_pod_to_disrupt_is_the_busiest_once_a_pod_is_busy() -> None:
    # Between turns every pod is idle: the choice asks again rather than take the first.
    setup = ScriptedLoads([{"pod-a": 0, "pod-b": 0}, {"pod-b": 0}, {"pod-a": 1, "pod-b": 3}])
    assert await setup.choose_pod("us-east") == "pod-b" and setup.looks == 3
    # Idle to the end: the busiest that answered, else the region's first pod.
    assert await ScriptedLoads([{"pod-b": 0}]).choose_pod("us-east", wait_s=0.05) == "pod-b"
    assert await ScriptedLoads([{}]).choose_pod("us-east", wait_s=0.05) == "pod-a"


def test_a_rotation_needs_certificates_and_the_ca_that_issues_them(tmp_path: Path) -> None:
    key = TenantKey("sk", "tenant", "us")
    plaintext = MeshTarget("http://edge", "127.0.0.1:1", {"us": "sk"}, "sk", MeshSecurity.insecure())
    with pytest.raises(DrillInputError, match="plaintext"):
        DrillSetup(ROTATION, plaintext, (key,), ZONES, rotate=lambda _: []).disruption_for("")
    issuer = tmp_path / "issuer"
    ensure_mesh_certs(issuer, [PlaneIdentity(Role.ADMIN, "admin")])
    # Copied elsewhere: no CA directory beside it.
    held = tmp_path / "copies" / "held"
    held.mkdir(parents=True)
    for name in ("admin.pem", "admin.key", "ca.pem"):
        (held / name).write_bytes((issuer / name).read_bytes())

    def target(directory: Path) -> MeshTarget:
        security = holder_security("admin", directory=directory)
        tls = MeshTls(certs_dir=directory)
        return MeshTarget("http://edge", "127.0.0.1:1", {"us": "sk"}, "sk", security, tls)

    with pytest.raises(DrillInputError, match=f"{held} holds no mesh CA"):
        DrillSetup(ROTATION, target(held), (key,), ZONES, rotate=lambda _: []).disruption_for("")
    commanded = DrillSetup(
        ROTATION, target(issuer), (key,), ZONES, "", "kubectl delete pod x", rotate=lambda _: []
    )
    with pytest.raises(DrillInputError, match="drop --disrupt-command"):
        commanded.disruption_for("")
    ready = DrillSetup(ROTATION, target(issuer), (key,), ZONES, rotate=lambda _: [])
    assert ready.disruption_for("").description.startswith(f"every certificate in {issuer}, 2 times")

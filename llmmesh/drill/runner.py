"""The phases of a failover drill.

1. Find the mesh and what to disrupt (:mod:`llmmesh.drill.setup`); wait
   (at most ``restore_timeout_s``) until geo-routing routes to every region
   of the traffic's zone: a drill just before may have left one restarting.
2. Read billing, start the geo-routing watch and the streams; run steady
   for ``disrupt_after_s``.
3. Disrupt (choosing the region now when none was named). A kill is
   restored by the mesh's supervisor (the drill waits for the restarted
   process, at most ``restore_timeout_s``); a partition is restored by the
   drill after ``restore_after_s`` (``outage_s`` for the global plane); a
   certificate rotation runs its rounds, ``rotate_every_s`` apart, and is
   over after the last (:mod:`llmmesh.drill.rotation`); a CA rotation
   likewise its three steps (:mod:`llmmesh.drill.ca_rotation`).
4. Run ``duration_s`` more, and on (at most ``restore_timeout_s``) until
   the target is back as :func:`llmmesh.drill.report.return_time` defines
   it; stop the streams, each finishing its turn.
5. Count the received tokens, wait for billing to catch up, report.

Every phase is bounded in time; whatever ends the drill, a stopped process
is continued (:meth:`~llmmesh.drill.disruption.Disruption.release`) and the
streams are dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import httpx

from llmmesh.drill.ca_rotation import CaSteps
from llmmesh.drill.disruption import Disruption
from llmmesh.drill.plan import DrillPlan
from llmmesh.drill.report import Timeline, billing_checked_turns, build_report, return_time, tally_tokens
from llmmesh.drill.rotation import CertRotation, Rotate
from llmmesh.drill.routing_watch import RoutingWatch
from llmmesh.drill.setup import DrillSetup, prepare
from llmmesh.drill.sse_turn import Outcome, TurnRecord
from llmmesh.drill.target import MeshTarget
from llmmesh.drill.tokens import TokenCounter
from llmmesh.drill.traffic import StreamFleet
from llmmesh.drill.usage import read_usage, wait_for_billing

PROGRESS_EVERY_S = 5.0
SLOW_DISRUPTION_S = 1.0
"""A disruption that takes this long to apply is named in the progress lines."""
Progress = Callable[[str], None]
_DOING = {
    "kill": "killing",
    "partition": "partitioning",
    "rotate": "rotating",
    "link-down": "taking down the link of",
}


class DrillRunner:
    """Runs one drill (see the module docstring)."""

    def __init__(self, setup: DrillSetup, progress: Progress) -> None:
        self.setup = setup
        self.plan = setup.plan
        self._progress = progress
        self._began = time.monotonic()
        self._fleet: StreamFleet | None = None
        self._disruption: Disruption | None = None
        self._region = setup.region
        self._pod = setup.plan.pod
        self._watch = RoutingWatch(
            setup.target.global_channel, setup.watched.tenant_id, setup.plan.poll_interval_s
        )

    def progress(self, text: str) -> None:
        self._progress(f"[{time.monotonic() - self._began:6.1f} s] {text}")

    async def run(self) -> dict[str, object]:
        streams = self.plan.streams
        limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
        timeout = httpx.Timeout(10.0, read=None, pool=None)
        edge = self.setup.target.edge_url
        async with httpx.AsyncClient(base_url=edge, limits=limits, timeout=timeout) as http:
            try:
                return await self._run(http)
            finally:
                if self._disruption is not None:
                    await self._disruption.release()
                if self._fleet is not None:
                    await self._fleet.abandon()
                await self._watch.stop()

    async def _run(self, http: httpx.AsyncClient) -> dict[str, object]:
        plan, setup = self.plan, self.setup
        self._watch.start()
        if plan.names_region:
            await self._wait_routed([self._region] if self._region else setup.zone_regions())
        before = await read_usage(http, [k.secret for k in setup.keys])
        if before is None:
            self.progress("GET /v1/usage does not answer: billing is not checked")
        fleet = self._fleet = StreamFleet(
            http, setup.keys, plan.streams, plan.max_tokens, plan.turn_timeout_s
        )
        started = time.monotonic()
        fleet.start()
        self.progress(
            f"{plan.streams} streams of {plan.max_tokens}-token turns; steady for {plan.disrupt_after_s:g} s"
        )
        await self._phase("steady", plan.disrupt_after_s)
        self._region = await setup.choose_region(fleet.in_flight.values)
        if self._region and not any(r.region == self._region for r in fleet.in_flight.values()):
            self.progress(
                f"no turn in flight runs on {self._region} now: the drill measures no stall there "
                "(leave out --region to disrupt the region the turns run on)"
            )
        self._pod = await setup.choose_pod(self._region)
        disruption = self._disruption = setup.disruption_for(self._region, self._pod)
        what = disruption.description if plan.mode == "rotate" else f"{plan.kind} {disruption.description}"
        self.progress(f"{_DOING[plan.mode]} {what}")
        # D is when the disruption began: a link or route command may take
        # seconds on a busy host, and the turns it reaches are those in flight now.
        disrupted = time.monotonic()
        await disruption.disrupt()
        applied = time.monotonic()
        if applied - disrupted >= SLOW_DISRUPTION_S:
            self.progress(f"{what}: the disruption took {applied - disrupted:.1f} s to apply")
        if not disruption.restores_itself:
            await self._phase("disrupted", plan.partition_s)
        restored = await disruption.restore(plan.restore_timeout_s)
        if restored is None:
            self.progress(f"{what} was not restored within {plan.restore_timeout_s:g} s")
        else:
            done = "done" if plan.mode == "rotate" else "restored"
            self.progress(f"{what} {done} after {restored - disrupted:.1f} s")
        await self._phase("after the restore", plan.duration_s)
        if restored is not None:
            await self._until_returned(Timeline(started, disrupted, restored, time.monotonic(), applied))
        self.progress("stopping the streams; each finishes its turn")
        await fleet.stop()
        timeline = Timeline(started, disrupted, restored, time.monotonic(), applied)
        source = await self._count_tokens(fleet.records)
        received = tally_tokens(fleet.records, plan.max_tokens).received
        checked = billing_checked_turns(plan, self._region, timeline, fleet.records)
        self.progress(f"waiting for billing (at most {plan.usage_wait_s:g} s)")
        usage = await wait_for_billing(
            http,
            setup.target.global_channel,
            before,
            received,
            [r.request_id for r in checked],
            plan.usage_wait_s,
        )
        await self._watch.stop()
        return build_report(
            plan=plan,
            region=self._region,
            target=disruption.description,
            timeline=timeline,
            records=fleet.records,
            routing=self._watch,
            region_zones=setup.region_zones,
            token_source=source,
            usage=usage,
            rotation=disruption.tally if isinstance(disruption, CertRotation) else None,
        )

    async def _phase(self, name: str, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(PROGRESS_EVERY_S, left))
            self.progress(f"{name}: {self._counts()}")

    def _counts(self) -> str:
        if self._fleet is None:
            return ""
        counts = self._fleet.counts()
        return (
            f"{counts[Outcome.DONE]} turns done, {counts[Outcome.FAILED_CLEARLY]} failed clearly, "
            f"{counts[Outcome.LOST]} lost, {len(self._fleet.in_flight)} in flight"
        )

    async def _wait_routed(self, regions: Sequence[str]) -> None:
        """Wait until geo-routing routes the tenant to every region of ``regions``."""
        deadline = time.monotonic() + self.plan.restore_timeout_s
        while True:
            routed = [s.regions for s in self._watch.samples[-1:] if s.regions is not None]
            waiting = sorted(set(regions) - (routed[0] if routed else set()))
            if not waiting:
                return
            if time.monotonic() > deadline:
                self.progress(f"geo-routing does not route to {', '.join(waiting)}; going on")
                return
            await asyncio.sleep(self.plan.poll_interval_s)

    async def _until_returned(self, timeline: Timeline) -> None:
        """Run on until the target is back (at most ``restore_timeout_s``)."""
        deadline = time.monotonic() + self.plan.restore_timeout_s
        while time.monotonic() < deadline:
            if return_time(self.plan, self._region, timeline, self._records(), self._watch) is not None:
                return
            await asyncio.sleep(self.plan.poll_interval_s)
        self.progress(f"not back within {self.plan.restore_timeout_s:g} s of the restore")

    def _records(self) -> Sequence[TurnRecord]:
        assert self._fleet is not None
        return [*self._fleet.records, *self._fleet.in_flight.values()]

    async def _count_tokens(self, records: Sequence[TurnRecord]) -> str:
        """Fill every record's received tokens; the source used."""
        async with TokenCounter(self.setup.tokenizer_pods(self._region, self._pod)) as counter:
            for record in records:
                record.received_tokens = await counter.count(record.text)
                if record.received_tokens is None:
                    break
            else:
                return "tokenizer"
        for record in records:
            # The mesh's own count, from the usage chunk: only turns that got that far have one.
            record.received_tokens = record.usage_output_tokens if record.outcome is Outcome.DONE else None
        return "usage" if any(r.received_tokens is not None for r in records) else "none"


async def run_drill(
    plan: DrillPlan,
    target: MeshTarget,
    progress: Progress,
    *,
    disrupt_command: str = "",
    restore_command: str = "",
    rotate: Rotate | None = None,
    ca_steps: CaSteps | None = None,
) -> dict[str, object]:
    """Prepare and run a drill; its report. DrillInputError, TargetError or
    DisruptionError when it cannot run. ``rotate`` re-issues the
    certificates of a directory (kind cert-rotation), ``ca_steps`` rotate
    its CA (kind ca-rotation)."""
    setup = await prepare(plan, target, disrupt_command, restore_command, rotate, ca_steps)
    return await DrillRunner(setup, progress).run()

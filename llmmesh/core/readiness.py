"""Readiness: whether a plane can do its work now, judged from the
dependencies it needs (its zone's Redis, its store, the global plane), and
why not when it cannot.

Readiness is not liveness. A plane whose Redis is down is alive and must not
be restarted for it; it should only stop being sent work (Kubernetes takes
it out of its Service's endpoints) until the dependency is back. So a plane
answers liveness from its process alone (the edge's port, gRPC health's
server-wide ``""`` status) and readiness from here (the edge's ``/readyz``,
the region's health status of its ChatService).

Each dependency is a :class:`DependencyCheck`: a name and a probe that
returns ``""`` when the dependency is up, else the reason (a probe that
raises, or outlasts its timeout, is down too). A dependency the plane
degrades without (the region's Redis: it then counts rate limits in its own
process) is not ``required``: it is reported, logged and exported like the
others, but does not make the plane unready, which would turn a graceful
degradation into an outage. A probe still running from
an earlier round is waited on, not started again, so a hung database never
piles up probes (or the worker threads a store's probe runs on).

The global plane is special: planes serve through its outages on what it
answered before (cached keys, routes, policy), for a grace, so it counts as
down only once unreachable past that grace (:class:`OutageGrace`, or the
region's policy staleness).

:class:`ReadinessWatch` runs the checks every few seconds and on demand,
exports ``llmmesh_dependency_up`` (:mod:`llmmesh.core.dependency_metrics`),
logs each change of a dependency with its reason, and tells its owner when
the plane's readiness flips.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from llmmesh.core.dependency_metrics import DEPENDENCY_UP
from llmmesh.core.tasks import cancel_and_wait

log = logging.getLogger(__name__)

READINESS_INTERVAL_S = 5.0
"""How often a watch checks its dependencies without being asked."""
PROBE_TIMEOUT_S = 2.0
"""How long one probe may take before its dependency counts as down."""
FRESH_S = 1.0
"""How old a report may be and still answer a readiness request."""

Probe = Callable[[], Coroutine[Any, Any, str]]


@dataclass(frozen=True)
class DependencyState:
    """One dependency as last checked."""

    name: str
    up: bool
    reason: str = ""
    required: bool = True


@dataclass(frozen=True)
class ReadinessReport:
    """Every dependency of a plane as last checked; ready when every required one is up."""

    dependencies: tuple[DependencyState, ...] = ()

    @property
    def ready(self) -> bool:
        return all(d.up or not d.required for d in self.dependencies)

    @property
    def reasons(self) -> list[str]:
        """``name: reason`` of each dependency that is down."""
        return [f"{d.name}: {d.reason}" for d in self.dependencies if not d.up]

    def body(self) -> dict[str, object]:
        """The report as JSON for ``/readyz``."""
        return {
            "status": "ok" if self.ready else "unavailable",
            "dependencies": {
                d.name: {"up": d.up, "required": d.required, "reason": d.reason} for d in self.dependencies
            },
        }


@dataclass(frozen=True)
class DependencyCheck:
    """A dependency and how to ask whether it is up (see the module docstring)."""

    name: str
    probe: Probe
    timeout_s: float = PROBE_TIMEOUT_S
    required: bool = True


class OutageGrace:
    """How long a dependency has been unreachable, against the grace a plane
    serves through its outages with: a reason only once past it."""

    def __init__(self, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._grace_s = grace_s
        self._clock = clock
        self._since: float | None = None

    def reason(self, reachable: bool) -> str:
        """``""`` while reachable or within the grace, else why not."""
        if reachable:
            self._since = None
            return ""
        now = self._clock()
        if self._since is None:
            self._since = now
        down_s = now - self._since
        if down_s <= self._grace_s:
            return ""
        return f"unreachable for {down_s:.0f} s, past the {self._grace_s:g} s the plane serves without it"


class _Running:
    """A dependency's probe, kept across rounds while it runs."""

    def __init__(self, check: DependencyCheck) -> None:
        self.check = check
        self._task: asyncio.Task[str] | None = None
        self._started = 0.0

    async def state(self) -> DependencyState:
        name = self.check.name
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.check.probe(), name=f"readiness-{name}")
            # Retrieved here: a probe that fails after its round gave up on it is not reported as lost.
            self._task.add_done_callback(lambda done: done.cancelled() or done.exception())
            self._started = time.monotonic()
        done, _ = await asyncio.wait({self._task}, timeout=self.check.timeout_s)
        if not done:
            waited = time.monotonic() - self._started
            return DependencyState(name, False, f"no answer for {waited:.1f} s", self.check.required)
        try:
            reason = self._task.result()
        except asyncio.CancelledError:
            return DependencyState(name, False, "the check was cancelled", self.check.required)
        except Exception as err:
            reason = str(err) or type(err).__name__
        return DependencyState(name, not reason, reason, self.check.required)

    async def close(self) -> None:
        # A finished probe's outcome was read (or is stale): only a running one is stopped.
        if self._task is not None and not self._task.done():
            await cancel_and_wait(self._task)


class ReadinessWatch:
    """Checks a plane's dependencies (see the module docstring).

    ``on_change`` is awaited with the plane's readiness whenever it flips,
    and once after the first check. Before that first check the plane
    counts as ready: a plane is started only once its dependencies opened.
    """

    def __init__(
        self,
        plane: str,
        checks: Sequence[DependencyCheck],
        *,
        interval_s: float = READINESS_INTERVAL_S,
        on_change: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        self._plane = plane
        self._running = [_Running(check) for check in checks]
        self._interval_s = interval_s
        self._on_change = on_change
        self.report = ReadinessReport(
            tuple(DependencyState(c.name, True, required=c.required) for c in checks)
        )
        self._checked_at: float | None = None
        self._round: asyncio.Task[ReadinessReport] | None = None
        self._loop: asyncio.Task[None] | None = None

    async def check(self) -> ReadinessReport:
        """Check every dependency now (joining a check already under way)."""
        if self._round is None or self._round.done():
            self._round = asyncio.create_task(self._check_all(), name=f"readiness-{self._plane}")
        return await asyncio.shield(self._round)

    async def fresh(self) -> ReadinessReport:
        """The last report when at most ``FRESH_S`` old, else a new one."""
        if self._checked_at is not None and time.monotonic() - self._checked_at <= FRESH_S:
            return self.report
        return await self.check()

    async def _check_all(self) -> ReadinessReport:
        states = await asyncio.gather(*(running.state() for running in self._running))
        first = self._checked_at is None
        before = self.report
        self.report = ReadinessReport(tuple(states))
        self._checked_at = time.monotonic()
        was = {d.name: d for d in before.dependencies}
        for state in states:
            DEPENDENCY_UP.labels(plane=self._plane, dependency=state.name).set(1 if state.up else 0)
            if not state.up and (first or was[state.name].up):
                effect = "not ready" if state.required else "degraded (serving without it)"
                log.warning("%s %s: %s is down: %s", self._plane, effect, state.name, state.reason)
            elif state.up and not was[state.name].up:
                log.info("%s: %s is up again", self._plane, state.name)
        if self._on_change is not None and (first or self.report.ready != before.ready):
            await self._on_change(self.report.ready)
        return self.report

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:
                log.exception("%s: checking readiness failed", self._plane)
            await asyncio.sleep(self._interval_s)

    def start(self) -> None:
        """Check now and every ``interval_s``, in the background: a slow
        dependency never holds up the plane's start."""
        self._loop = asyncio.create_task(self._run(), name=f"readiness-{self._plane}-loop")

    async def close(self) -> None:
        """Stop checking; the plane's series go with it."""
        await cancel_and_wait(self._loop)
        if self._round is not None and not self._round.done():
            await cancel_and_wait(self._round)
        for running in self._running:
            await running.close()
            try:
                DEPENDENCY_UP.remove(self._plane, running.check.name)
            except KeyError:
                pass

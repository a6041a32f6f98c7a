"""Per-hop time of a turn's first token, as each plane sees it.

Every plane stamps, on its monotonic clock, the points a turn passes on the
way to its first token (the edge: request arrived, start sent to a region,
first delta back, first chunk written; the region: its stages up to the
first delta it sends on; a pod: start arrived, scheduled, first token) and
observes the time between consecutive stamps into one Prometheus histogram
per plane, labelled by ``hop`` (``llmmesh_edge_hop_seconds``,
``llmmesh_region_hop_seconds``, ``llmmesh_engine_hop_seconds``). A hop is
named after the work it spans and ends where the next begins, so a plane's
hops are consecutive and their sum is the plane's whole time to its first
token.

A turn is observed once, when its first token passes the last stamp; a
turn that never gets there (refused, failed, cancelled) observes nothing,
so every hop of a plane counts the same turns. Stamping is a
``time.monotonic()`` call and a list append; observing is one histogram
``observe`` per hop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

HOP_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
    0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
"""Fine buckets, 0.1 ms to 1 s: most hops take well under a millisecond."""


def hop_histogram(name: str, plane: str, hops: str, registry: CollectorRegistry) -> Histogram:
    """The plane's ``{name}`` histogram of hop durations, labelled ``hop``;
    ``hops`` lists them for its help text."""
    return Histogram(
        name,
        f"Seconds a turn spent in each hop of the {plane} on the way to its first token, by hop "
        f"({hops}), consecutive: their sum is the {plane}'s time to the first token",
        ["hop"],
        buckets=HOP_BUCKETS,
        registry=registry,
    )


class HopStamps:
    """One turn's stamps in one plane, from ``start_s`` on.

    :meth:`stamp` marks the end of a hop, which began at the stamp before (a later stamp of the same name
    replaces it and drops those after it, as when a pod failed and the turn
    is placed again); :meth:`observe` observes every hop once.
    """

    __slots__ = ("_clock", "_observed", "_stamps", "start_s")

    def __init__(self, start_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.start_s = clock() if start_s is None else start_s
        self._stamps: list[tuple[str, float]] = []
        self._observed = False

    def stamp(self, hop: str, at_s: float | None = None) -> None:
        """The turn finished ``hop`` now (or at ``at_s``)."""
        at = self._clock() if at_s is None else at_s
        for index, (name, _) in enumerate(self._stamps):
            if name == hop:
                del self._stamps[index:]
                break
        self._stamps.append((hop, at))

    def stamp_once(self, hop: str) -> None:
        """:meth:`stamp`, unless ``hop`` was stamped already."""
        if all(name != hop for name, _ in self._stamps):
            self.stamp(hop)

    def durations(self) -> list[tuple[str, float]]:
        """Each hop and its seconds, in order."""
        out: list[tuple[str, float]] = []
        last = self.start_s
        for hop, at in self._stamps:
            out.append((hop, max(0.0, at - last)))
            last = at
        return out

    def observe(self, histogram: Histogram) -> None:
        """Observe every hop into ``histogram`` (labelled ``hop``), once per turn."""
        if self._observed:
            return
        self._observed = True
        for hop, seconds in self.durations():
            histogram.labels(hop=hop).observe(seconds)

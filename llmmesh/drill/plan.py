"""What a failover drill does and for how long."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("region", "pod", "global-plane", "redis", "cert-rotation", "ca-rotation", "partition-global")
"""What a drill disrupts: a region, one engine pod of a region, the global
plane, the mesh's Redis; ``cert-rotation`` re-issues every certificate of
the mesh; ``ca-rotation`` rotates the mesh CA (a new CA trusted beside the
old, every certificate re-issued from it, the old CA retired, each step
``rotate_every_s`` after the last); ``partition-global`` cuts a region off from the global plane
alone, while the edge still reaches it."""
KIND_ALIASES = {"engine-pod": "pod"}
"""Former names of kinds, still accepted: a plan (and its report) names the kind by :data:`KINDS`."""
ROTATION_KINDS = ("cert-rotation", "ca-rotation")
"""The kinds that rotate certificates (mode ``rotate``) rather than disrupt a part."""
MIN_CA_STEP_S = 2.0
"""The least time between two steps of a CA rotation: planes re-read their
certificate files at most once a second, and each step needs every plane
to have read the one before."""
REGION_KINDS = ("region", "pod", "partition-global")
"""The kinds that disrupt one region (or one of its pods), chosen by ``--region`` or by the traffic."""
MODES = ("kill", "partition", "rotate", "link-down")
"""How: SIGKILL (the mesh's supervisor restarts the process), or SIGSTOP then
SIGCONT (the process stops answering while its connections stay open, as in
a network cut); ``rotate`` is the only mode of ``cert-rotation`` and
``ca-rotation``, and only theirs;
``link-down`` takes the network link of the part's host down, then up again
(a mesh of ``llmmesh up --netns``; kinds region and global-plane).
``partition-global`` goes with ``partition`` only: the region's host and the
global plane's drop every packet between them, then pass them again (a mesh
of ``llmmesh up --netns``, :class:`~llmmesh.drill.disruption.RouteDisruption`)."""
LINK_KINDS = ("region", "global-plane")
"""The kinds whose part has a host of its own, and so a link to take down."""


def canonical_kind(kind: str) -> str:
    """The name of ``kind`` in :data:`KINDS` (a former name's current one)."""
    return KIND_ALIASES.get(kind, kind)


@dataclass(frozen=True)
class DrillPlan:
    """The settings of one drill; every phase is bounded in time."""

    kind: str = "region"
    """One of :data:`KINDS` (a former name of :data:`KIND_ALIASES` becomes its current one)."""
    mode: str = "kill"
    """One of :data:`MODES`."""
    region: str = ""
    """The region disrupted (kinds region, partition-global), or whose pod is
    (kind pod); empty for the region of the tenant's zone running most turns
    at the moment of the disruption."""
    pod: str = ""
    """The pod disrupted (kind pod); empty for the region's first."""
    streams: int = 32
    """Concurrent SSE streams, each a sequence of turns."""
    max_tokens: int = 128
    """Output tokens of every turn (sent with ``ignore_eos``, so each turn's count is known)."""
    disrupt_after_s: float = 20.0
    """Steady traffic before the disruption."""
    restore_after_s: float = 10.0
    """How long a partition lasts (kinds region, pod, redis, partition-global)."""
    outage_s: float = 60.0
    """How long a global-plane partition lasts."""
    duration_s: float = 20.0
    """Traffic after the restore."""
    turn_timeout_s: float = 90.0
    """Longest one turn may take before it counts as lost."""
    restore_timeout_s: float = 120.0
    """Longest the drill waits for a killed process to be restarted, and for
    the target to serve again after the restore."""
    usage_wait_s: float = 60.0
    """Longest the drill waits for billing to catch up after the traffic ends."""
    poll_interval_s: float = 0.25
    """Interval of the geo-routing and process polls."""
    rotations: int = 3
    """Rounds of certificate rotation (kind cert-rotation)."""
    rotate_every_s: float = 5.0
    """Time between two rounds of certificate rotation, or two steps of a CA rotation."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", canonical_kind(self.kind))
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if (self.kind in ROTATION_KINDS) != (self.mode == "rotate"):
            raise ValueError(
                "kinds cert-rotation and ca-rotation go with mode rotate, and mode rotate only with them"
            )
        if self.kind == "ca-rotation" and self.rotate_every_s < MIN_CA_STEP_S:
            raise ValueError(
                f"kind ca-rotation needs rotate_every_s of at least {MIN_CA_STEP_S:g}: planes re-read "
                "their certificates at most once a second"
            )
        if self.kind == "partition-global" and self.mode != "partition":
            raise ValueError("kind partition-global cuts a region off from the global plane: mode partition")
        if self.mode == "link-down" and self.kind not in LINK_KINDS:
            raise ValueError(f"mode link-down takes a host's link down: kind {' or '.join(LINK_KINDS)}")
        if self.streams < 1 or self.max_tokens < 1 or self.rotations < 1:
            raise ValueError("streams, max_tokens and rotations must be at least 1")
        times = (
            self.disrupt_after_s,
            self.restore_after_s,
            self.outage_s,
            self.duration_s,
            self.rotate_every_s,
        )
        if min(times) < 0 or min(self.turn_timeout_s, self.restore_timeout_s, self.poll_interval_s) <= 0:
            raise ValueError("durations must not be negative, and timeouts must be positive")
        if self.usage_wait_s < 0:
            raise ValueError("usage_wait_s must not be negative")

    @property
    def partition_s(self) -> float:
        """How long a partition of this kind lasts; for cert-rotation, from
        the first round to the last; for ca-rotation, its first step to its last."""
        if self.kind == "cert-rotation":
            return self.rotate_every_s * (self.rotations - 1)
        if self.kind == "ca-rotation":
            return self.rotate_every_s * 2
        return self.outage_s if self.kind == "global-plane" else self.restore_after_s

    @property
    def names_region(self) -> bool:
        """Whether the kind disrupts one region (a region, one of its pods, its link to the global plane)."""
        return self.kind in REGION_KINDS

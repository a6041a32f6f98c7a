"""The figures of a drill, from the turn records, geo-routing's answers and billing.

Times are seconds; ``D`` is the moment the drill began the disruption
(a signal goes at once; a link or route change runs a command, which on a
busy host may take seconds to return, ``disruption_took_s``, and a turn in
flight when it began may end before it returns), ``R`` the
restore (the SIGCONT of a partition, the link back up of a link-down, the
routes removed of a partition-global; for a kill, the moment ``mesh.json``
names the restarted process, which serves by then; for a certificate
rotation, the end of its last round), ``W`` the end of the failover
window: ``R``, or the end of the traffic when there was no restore.

- ``streams_total``: streams run. ``turns_total``: turns sent;
  ``turns_done`` ended with ``[DONE]``; ``turns_failed_clearly`` ended with
  an OpenAI error object (an HTTP error's body or an error event);
  ``turns_lost`` with neither (a stream that broke off, hung past the turn
  timeout, or a refusal without an error object). ``errors`` counts the
  error codes of the clear failures and the causes of the lost turns.
- A turn is *affected* when the disruption reached it: for the kinds that
  name a region (``region``, ``pod``, ``partition-global``), a turn in
  flight at ``D`` that had started on the region (its
  ``x-llmmesh-region``); for the other kinds, a turn in
  flight at any moment of ``[D, W]``. ``streams_affected``
  counts the streams with an affected turn.
- ``tokens_lost`` and ``tokens_duplicated``: every turn asks for
  ``max_tokens`` tokens with ``ignore_eos``, so a turn that ended with
  ``[DONE]`` (except one a content filter ended) must have received exactly
  that many: fewer are lost, more are duplicated (the received text's
  tokens, :mod:`llmmesh.drill.tokens`). A turn that did not end with
  ``[DONE]`` adds the content event ids missing from its sequence
  (``1, 2, …``) to the lost tokens and the repeated ones to the duplicated
  (at least one token each). ``sequence_gaps`` and ``sequence_repeats``
  count those faults over every turn.
- ``stall_p50_s``, ``stall_p99_s``, ``stall_max_s``: an affected turn's
  stall is the longest gap between consecutive moments its client saw
  (the request sent, the response headers, each SSE event, the end) among
  the gaps that end at or after ``D``; percentiles by nearest rank over
  the affected turns; null when none was affected.
- ``outage_s``: from ``D`` to ``R``; ``disruption_took_s``: from ``D``
  until the disruption's call returned (a signal's, at once; a command's,
  seconds on a busy host).
- ``time_to_exclude_s``: from ``D`` until geo-routing's ``Route`` for the
  drill's tenant first left the region out (the kinds that name a region);
  null when it never did (a pod whose region kept serving, a restart
  quicker than the heartbeat timeout).
- ``partition-global`` only: ``excluded_s``, how long geo-routing left the
  region out (from its first answer without it after ``D`` to its first
  with it again, or the end of the traffic; null when it never left it
  out), and ``turns_on_region_while_excluded``, the turns sent in the
  second half of that time that started on the region before it ended:
  by then no route the edge remembered from before the exclusion sends a
  turn anywhere, so each is the edge's own check keeping a region that
  serves against the global plane's stale DOWN (null when never left out).
- ``time_to_return_s``: from ``R`` until the region was routed to again
  and, when it served turns before ``D``, a turn sent after ``R`` started
  on it; for ``global-plane``, until geo-routing answered again and a
  turn sent after ``R`` was accepted; for ``redis`` and the rotations,
  until a turn sent after ``R`` was accepted. Null when that did not happen
  before the drill ended.
- ``residency``: every turn's region (``x-llmmesh-region``) must be in
  its tenant's zone; a region outside the directory counts as a violation.
- ``usage``: the output tokens billed during the drill against the tokens
  the clients received (every turn, finished or not), once billing caught
  up (:mod:`llmmesh.drill.usage`). The drill's turns are never cancelled,
  so a turn the mesh failed must be billed exactly what its client
  received, and the two totals must be equal: ``usage.exact`` is whether
  they are (null when billing could not be read, or when the received
  tokens of a turn that failed mid-stream could not be counted, the
  ``usage`` count source knowing only finished turns'). ``usage_records_lost``: turns that
  ended with ``[DONE]`` within ``[D, W]`` and were not affected, whose
  request id billing still did not know after the wait.
- ``token_count_source``: ``tokenizer`` or ``usage``
  (:mod:`llmmesh.drill.tokens`); ``turns_uncounted``: turns that ended with
  ``[DONE]`` whose tokens could not be counted (not in the figures above).
- ``cert-rotation`` only (:mod:`llmmesh.drill.rotation`):
  ``cert_rotations`` (rounds run), ``certificates_rotated`` (certificates
  re-issued over all rounds), ``servers_checked`` (gRPC servers asked for
  their certificate on a new connection after every round),
  ``servers_presenting_new_cert`` (those that presented the round's new
  certificate every time) and ``servers_not_presenting_new_cert`` (the
  others, with why).
- ``ca-rotation`` only (:mod:`llmmesh.drill.ca_rotation`): the figures of
  ``cert-rotation`` for its one re-issue (each server checked after it and
  again after the retirement), ``old_ca_retired``, and
  ``servers_refusing_old_ca`` (servers that refused the old CA's admin
  certificate on a new connection after the retirement) with
  ``servers_accepting_old_ca`` (the others, with why).
- ``passed``: tokens were counted, none was lost or duplicated, no turn
  was lost, residency held, no usage record was lost and billing was not
  found inexact (``usage.exact`` is not false); for
  ``global-plane`` also no turn failed (regions serve through its outage
  on cached policy, so a failure there is not a clear error but a miss);
  for ``redis`` too (the edge streams on without its stream log, regions
  count rate limits in their own process); for ``partition-global``
  also no turn failed and, when geo-routing left the region out,
  ``turns_on_region_while_excluded`` is not 0 (the region kept serving
  its zone); for ``cert-rotation`` also no turn failed,
  every round ran and every server presented the new certificates (a
  rotation should be invisible); for ``ca-rotation`` also no turn failed,
  every step ran, every server presented the new CA's certificate and
  refused the old CA's once it was retired.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmmesh.drill.plan import ROTATION_KINDS, DrillPlan
from llmmesh.drill.rotation import RotationTally
from llmmesh.drill.routing_watch import RoutingWatch
from llmmesh.drill.sse_turn import Outcome, TurnRecord
from llmmesh.drill.usage import UsageCheck

MAX_VIOLATIONS_SHOWN = 10


@dataclass(frozen=True)
class Timeline:
    """The drill's moments (monotonic)."""

    started: float
    disrupted: float
    """When the drill began the disruption (``D``)."""
    restored: float | None
    traffic_ended: float
    applied: float | None = None
    """When the disruption's own call returned (None: not known)."""

    @property
    def window_end(self) -> float:
        return self.restored if self.restored is not None else self.traffic_ended


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def sequence_faults(content_ids: Iterable[int]) -> tuple[int, int]:
    """Ids missing from ``1, 2, …`` and ids repeated (not above the last one seen)."""
    last = 0
    missing = repeated = 0
    for event_id in content_ids:
        if event_id <= last:
            repeated += 1
            continue
        missing += event_id - last - 1
        last = event_id
    return missing, repeated


def stall_of(record: TurnRecord, disrupted: float) -> float:
    """The longest gap its client saw that ends at or after ``disrupted``."""
    moments = [record.sent_at]
    if record.headers_at is not None:
        moments.append(record.headers_at)
    moments += record.event_times
    moments.append(max(record.ended_at, moments[-1]))
    gaps = [later - earlier for earlier, later in itertools.pairwise(moments) if later >= disrupted]
    return max(gaps, default=0.0)


def affected_turns(
    plan: DrillPlan, region: str, timeline: Timeline, records: Sequence[TurnRecord]
) -> list[TurnRecord]:
    """The turns the disruption reached (see the module docstring)."""
    if plan.names_region:
        return [r for r in records if r.region == region and r.in_flight_at(timeline.disrupted)]
    return [r for r in records if r.sent_at <= timeline.window_end and r.ended_at >= timeline.disrupted]


def billing_checked_turns(
    plan: DrillPlan, region: str, timeline: Timeline, records: Sequence[TurnRecord]
) -> list[TurnRecord]:
    """The turns whose usage records must reach billing: [DONE] within the window, not affected."""
    affected = (
        {id(r) for r in affected_turns(plan, region, timeline, records)} if plan.names_region else set()
    )
    return [
        r
        for r in records
        if r.outcome is Outcome.DONE
        and r.request_id
        and r.ended_between(timeline.disrupted, timeline.window_end)
        and id(r) not in affected
    ]


@dataclass(frozen=True)
class TokenTally:
    """Token faults over a drill's turns (see the module docstring)."""

    lost: int = 0
    duplicated: int = 0
    received: int = 0
    gaps: int = 0
    repeats: int = 0
    filtered: int = 0
    uncounted: int = 0
    """Turns that ended with [DONE] whose tokens could not be counted."""


def tally_tokens(records: Sequence[TurnRecord], expected: int) -> TokenTally:
    lost = duplicated = received = gaps = repeats = filtered = uncounted = 0
    for record in records:
        missing, repeated = sequence_faults(record.content_ids)
        gaps += missing
        repeats += repeated
        received += record.received_tokens or 0
        if record.outcome is not Outcome.DONE:
            lost += missing
            duplicated += repeated
        elif record.finish_reason == "content_filter":
            filtered += 1
        elif record.received_tokens is None:
            uncounted += 1
        else:
            lost += max(0, expected - record.received_tokens)
            duplicated += max(0, record.received_tokens - expected)
    return TokenTally(lost, duplicated, received, gaps, repeats, filtered, uncounted)


def billing_exact(records: Sequence[TurnRecord], usage: UsageCheck) -> bool | None:
    """Whether billing took exactly the output tokens the clients received;
    None when either side is unknown (see the module docstring)."""
    uncounted = any(
        r.outcome is not Outcome.DONE and r.content_ids and r.received_tokens is None for r in records
    )
    if usage.billed_output_tokens is None or uncounted:
        return None
    return usage.billed_output_tokens == usage.received_output_tokens


def residency(records: Sequence[TurnRecord], region_zones: Mapping[str, str]) -> dict[str, object]:
    """Whether every turn ran in its tenant's zone."""
    violations = [
        {
            "request_id": r.request_id,
            "region": r.region,
            "tenant_zone": r.zone,
            "region_zone": region_zones.get(r.region),
        }
        for r in records
        if r.region and region_zones.get(r.region) != r.zone
    ]
    return {
        "held": not violations,
        "turns_checked": sum(1 for r in records if r.region),
        "violations": len(violations),
        "violations_shown": violations[:MAX_VIOLATIONS_SHOWN],
    }


def _since(start: float | None, *moments: float | None) -> float | None:
    if start is None or any(m is None for m in moments):
        return None
    return round(max(m for m in moments if m is not None) - start, 3)


def _first_accepted_after(records: Sequence[TurnRecord], start: float, region: str = "") -> float | None:
    times = [
        r.headers_at
        for r in records
        if r.sent_at >= start
        and r.accepted
        and r.headers_at is not None
        and (not region or r.region == region)
    ]
    return min(times, default=None)


def return_time(
    plan: DrillPlan, region: str, timeline: Timeline, records: Sequence[TurnRecord], routing: RoutingWatch
) -> float | None:
    restored = timeline.restored
    if restored is None:
        return None
    if plan.kind == "global-plane":
        return _since(
            restored, routing.first_answer_after(restored), _first_accepted_after(records, restored)
        )
    if not plan.names_region:
        return _since(restored, _first_accepted_after(records, restored))
    serving = routing.first_after(restored, listing=region, listed=True)
    served_before = any(r.region == region and r.sent_at < timeline.disrupted for r in records)
    routed = _first_accepted_after(records, restored, region) if served_before else restored
    return _since(restored, serving, routed)


def excluded_window(region: str, timeline: Timeline, routing: RoutingWatch) -> tuple[float, float] | None:
    """From when geo-routing first left ``region`` out after ``D`` until it
    listed it again (or the traffic ended); None when it never left it out."""
    left_out = routing.first_after(timeline.disrupted, listing=region, listed=False)
    if left_out is None:
        return None
    listed = routing.first_after(left_out, listing=region, listed=True)
    return left_out, listed if listed is not None else timeline.traffic_ended


def turns_while_excluded(region: str, window: tuple[float, float], records: Sequence[TurnRecord]) -> int:
    """``turns_on_region_while_excluded`` over the ``window`` of :func:`excluded_window`."""
    start, end = window
    half = start + (end - start) / 2
    return sum(
        1
        for r in records
        if r.region == region
        and r.accepted
        and r.sent_at >= half
        and r.headers_at is not None
        and r.headers_at <= end
    )


def _exclusion_figures(
    region: str, timeline: Timeline, records: Sequence[TurnRecord], routing: RoutingWatch
) -> dict[str, object]:
    window = excluded_window(region, timeline, routing)
    if window is None:
        return {"excluded_s": None, "turns_on_region_while_excluded": None}
    return {
        "excluded_s": round(window[1] - window[0], 3),
        "turns_on_region_while_excluded": turns_while_excluded(region, window, records),
    }


def _rotation_held(plan: DrillPlan, rotation: RotationTally | None) -> bool:
    """Every round (or step) ran, and every server checked presented the new certificates."""
    return rotation is not None and rotation.held(plan.rotations)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def build_report(
    *,
    plan: DrillPlan,
    region: str,
    target: str,
    timeline: Timeline,
    records: Sequence[TurnRecord],
    routing: RoutingWatch,
    region_zones: Mapping[str, str],
    token_source: str,
    usage: UsageCheck,
    rotation: RotationTally | None = None,
) -> dict[str, object]:
    """The drill's one JSON object (see the module docstring); ``rotation``
    is what a cert-rotation drill's rounds did."""
    affected = affected_turns(plan, region, timeline, records)
    stalls = [stall_of(r, timeline.disrupted) for r in affected]
    tokens = tally_tokens(records, plan.max_tokens)
    outcomes = Counter(r.outcome for r in records)
    errors = Counter(r.error_code for r in records if r.outcome is not Outcome.DONE)
    held = residency(records, region_zones)
    exclude = (
        _since(timeline.disrupted, routing.first_after(timeline.disrupted, listing=region, listed=False))
        if plan.names_region
        else None
    )
    counted = tokens.uncounted == 0 and token_source != "none"
    exact = billing_exact(records, usage)
    excluded = (
        _exclusion_figures(region, timeline, records, routing) if plan.kind == "partition-global" else {}
    )
    passed = (
        counted
        and tokens.lost == 0
        and tokens.duplicated == 0
        and outcomes[Outcome.LOST] == 0
        and bool(held["held"])
        and usage.records_missing in (0, None)
        and exact is not False
        and (
            plan.kind not in ("global-plane", "redis", *ROTATION_KINDS, "partition-global")
            or outcomes[Outcome.FAILED_CLEARLY] == 0
        )
        and excluded.get("turns_on_region_while_excluded") != 0
        and (plan.kind not in ROTATION_KINDS or _rotation_held(plan, rotation))
    )
    rotated = rotation.figures() if rotation is not None and plan.kind in ROTATION_KINDS else {}
    return {
        "drill": "failover",
        "kind": plan.kind,
        "mode": plan.mode,
        "region": region or None,
        "target": target,
        "streams_total": plan.streams,
        "streams_affected": len({r.stream for r in affected}),
        "turns_total": len(records),
        "turns_done": outcomes[Outcome.DONE],
        "turns_failed_clearly": outcomes[Outcome.FAILED_CLEARLY],
        "turns_lost": outcomes[Outcome.LOST],
        "turns_affected": len(affected),
        "tokens_per_turn": plan.max_tokens,
        "tokens_received": tokens.received,
        "tokens_lost": tokens.lost,
        "tokens_duplicated": tokens.duplicated,
        "token_count_source": token_source,
        "turns_uncounted": tokens.uncounted,
        "turns_filtered": tokens.filtered,
        "sequence_gaps": tokens.gaps,
        "sequence_repeats": tokens.repeats,
        "stall_p50_s": _round(percentile(stalls, 50)),
        "stall_p99_s": _round(percentile(stalls, 99)),
        "stall_max_s": _round(max(stalls, default=None)),
        "time_to_exclude_s": exclude,
        **excluded,
        "time_to_return_s": return_time(plan, region, timeline, records, routing),
        "restored": timeline.restored is not None,
        "outage_s": _since(timeline.disrupted, timeline.restored),
        "disruption_took_s": _since(timeline.disrupted, timeline.applied),
        "residency": held,
        "usage": {
            "billed_output_tokens": usage.billed_output_tokens,
            "received_output_tokens": usage.received_output_tokens,
            "difference": (
                None
                if usage.billed_output_tokens is None
                else usage.billed_output_tokens - usage.received_output_tokens
            ),
            "exact": exact,
            "caught_up": usage.caught_up,
            "waited_s": round(usage.waited_s, 3),
        },
        "usage_records_checked": len(billing_checked_turns(plan, region, timeline, records)),
        "usage_records_lost": usage.records_missing,
        "errors": dict(sorted(errors.items())),
        **rotated,
        "passed": passed,
        "settings": dataclasses.asdict(plan),
    }

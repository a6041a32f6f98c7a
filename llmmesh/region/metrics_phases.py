"""The region's counters of hedged and disaggregated turns, on the region's
registry (:data:`region.metrics.REGISTRY`), served on its ``/metrics``.

- ``llmmesh_region_hedges_started_total``: hedged turns whose backup pod
  started the turn after the first pod's TTFT deadline passed.
- ``llmmesh_region_hedges_won_total``: of those, turns the backup pod won
  (its first token came first).
- ``llmmesh_region_hedge_losers_aborted_total``: losing generations the
  region abandoned (the pod aborts them; they are never metered).
- ``llmmesh_region_disaggregated_turns_total``: turns started as a prefill
  phase on a prefill pod followed by a decode phase on a decode pod.
- ``llmmesh_region_kv_transfer_fallbacks_total``: of those, turns whose
  prefill pod failed, so the decode pod computed the prompt itself.
"""

from __future__ import annotations

from prometheus_client import Counter

from llmmesh.region.metrics import REGISTRY

HEDGES_STARTED = Counter(
    "llmmesh_region_hedges_started",
    "Hedged turns whose backup pod started the turn after the TTFT deadline",
    registry=REGISTRY,
)
HEDGES_WON = Counter(
    "llmmesh_region_hedges_won",
    "Hedged turns won by the backup pod (its first token came first)",
    registry=REGISTRY,
)
HEDGE_LOSERS_ABORTED = Counter(
    "llmmesh_region_hedge_losers_aborted",
    "Losing generations of hedged turns abandoned and aborted at their pod",
    registry=REGISTRY,
)
DISAGGREGATED_TURNS = Counter(
    "llmmesh_region_disaggregated_turns",
    "Turns started as a prefill phase on a prefill pod and a decode phase on a decode pod",
    registry=REGISTRY,
)
KV_TRANSFER_FALLBACKS = Counter(
    "llmmesh_region_kv_transfer_fallbacks",
    "Disaggregated turns whose prefill pod failed, so the decode pod computed the prompt",
    registry=REGISTRY,
)


def hedge_started() -> None:
    HEDGES_STARTED.inc()


def hedge_won() -> None:
    HEDGES_WON.inc()


def hedge_loser_aborted() -> None:
    HEDGE_LOSERS_ABORTED.inc()


def disaggregated_turn(fallback: bool) -> None:
    """Count a disaggregated turn that started; ``fallback`` when its
    decode pod had to compute the prompt."""
    DISAGGREGATED_TURNS.inc()
    if fallback:
        KV_TRANSFER_FALLBACKS.inc()

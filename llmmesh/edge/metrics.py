"""Prometheus metrics of the edge, served on ``/metrics``; with them
``llmmesh_dependency_up{plane="edge"}`` (:mod:`llmmesh.core.dependency_metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from llmmesh.core import dependency_metrics
from llmmesh.core.hop_timing import hop_histogram

REGISTRY = CollectorRegistry()
dependency_metrics.register(REGISTRY, stores=False)

REQUESTS = Counter(
    "llmmesh_edge_requests",
    "HTTP requests answered, by route and status",
    ["route", "status"],
    registry=REGISTRY,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "llmmesh_edge_time_to_first_token_seconds",
    "Seconds from request arrival to the first streamed token, by the model that answered and the region "
    "that first served it (both bounded: the mesh's models and regions)",
    ["model", "region"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
OUTPUT_TOKENS = Counter("llmmesh_edge_output_tokens", "Output tokens delivered to clients", registry=REGISTRY)
STREAM_ERRORS = Counter(
    "llmmesh_edge_stream_errors",
    "Streams that ended with an error event, by code",
    ["code"],
    registry=REGISTRY,
)
STREAMS_UNLOGGED = Counter(
    "llmmesh_edge_streams_unlogged",
    "Streams that went on without resumability: their shared log could not be opened "
    "('log_unreachable') or a write to it failed mid-stream ('log_write_failed')",
    ["reason"],
    registry=REGISTRY,
)
for _reason in ("log_unreachable", "log_write_failed"):
    STREAMS_UNLOGGED.labels(reason=_reason)
SETTLEMENTS = Counter(
    "llmmesh_edge_turn_settlements",
    "Turns the mesh failed whose usage the edge settled to the output delivered: 'settled', "
    "'over_billed' (billing had already taken more) or 'failed' (no region of the zone answered)",
    ["outcome"],
    registry=REGISTRY,
)
for _outcome in ("settled", "over_billed", "failed"):
    SETTLEMENTS.labels(outcome=_outcome)
FAILOVERS = Counter(
    "llmmesh_edge_failovers",
    "Mid-stream failovers: 'continued' in another region of the zone, or 'failed' for want of one",
    ["outcome"],
    registry=REGISTRY,
)
# Both outcomes are exposed from the start, at 0, so failover rates and
# dashboards have a series before the first failover.
for _outcome in ("continued", "failed"):
    FAILOVERS.labels(outcome=_outcome)
# A turn's way to its first token through the edge (llmmesh.core.hop_timing):
# edge_in (request arrived to its start sent to a region), region (to the
# region's first delta back), edge_out (to the first content chunk written
# to the stream the client reads).
EDGE_HOPS = ("edge_in", "region", "edge_out")
HOPS = hop_histogram("llmmesh_edge_hop_seconds", "edge", ", ".join(EDGE_HOPS), REGISTRY)

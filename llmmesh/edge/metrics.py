"""Prometheus metrics of the edge, served on ``/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry()

REQUESTS = Counter(
    "llmmesh_edge_requests",
    "HTTP requests answered, by route and status",
    ["route", "status"],
    registry=REGISTRY,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "llmmesh_edge_time_to_first_token_seconds",
    "Seconds from request arrival to the first streamed token",
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

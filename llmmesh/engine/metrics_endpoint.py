"""The pod's ``/metrics`` endpoint: its backend's Prometheus registry (vLLM's
metric names) over HTTP, in the text format, on a thread of its own; the
mesh's one endpoint (:mod:`llmmesh.core.metrics_http`)."""

from __future__ import annotations

from llmmesh.core.metrics_http import MetricsEndpoint

__all__ = ["MetricsEndpoint"]

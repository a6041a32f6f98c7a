"""A pod's own Prometheus series beside its backend's (vLLM's names):
``llmmesh_engine_hop_seconds{hop}``, a generation's way to its first token
through the pod (:mod:`llmmesh.core.hop_timing`), observed for every
generation, a region session stream's or a Generate call's:

- ``prepare``: its start arrived, to the request validated and handed to the backend;
- ``queue``: to the backend scheduling it (``started``: a batch took it);
- ``first_token``: to its first token.

Each pod owns its registry (several share a process in tests and the
embedded mesh); the pod's ``/metrics`` serves it with the backend's
(:func:`pod_registry`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmmesh.core.hop_timing import hop_histogram

ENGINE_HOPS = ("prepare", "queue", "first_token")


class EngineHopMetrics:
    """The hop histogram of one pod, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.hops = hop_histogram("llmmesh_engine_hop_seconds", "pod", ", ".join(ENGINE_HOPS), self.registry)


def pod_registry(backend: CollectorRegistry, own: CollectorRegistry) -> CollectorRegistry:
    """One registry that serves both: the backend's series and the pod's own."""
    combined = CollectorRegistry()
    combined.register(backend)
    combined.register(own)
    return combined

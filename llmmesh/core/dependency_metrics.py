"""Series about what a plane depends on, shared by the planes that have it;
each plane registers them in its own registry (:func:`register`).

- ``llmmesh_dependency_up{plane,dependency}``: 1 while a dependency the plane
  needs to serve answers (``redis``, ``zone_store``, ``global_plane``: the
  last only once its outage outlasted the plane's grace), 0 while it does
  not: the readiness the plane reports (:mod:`llmmesh.core.readiness`).
- ``llmmesh_store_errors_total{store,kind}``: transactions of a SQL store
  (``global``, ``zone``, ``retrieval``) that failed for the database's sake:
  ``unavailable`` (the database could not be reached or dropped the
  connection) or ``conflict`` (serialization conflicts went on past every
  retry). Constraint violations, which callers expect, are not counted.

One collector serves every registry it is registered in, so a process that
runs several planes (an in-process test mesh; ``llmmesh up`` runs one plane
a process) shows each plane's samples on every endpoint; the labels tell
them apart.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

STORE_ERROR_KINDS = ("unavailable", "conflict")

DEPENDENCY_UP = Gauge(
    "llmmesh_dependency_up",
    "1 while a dependency the plane needs answers, 0 while it does not (readiness), by plane and dependency",
    ["plane", "dependency"],
    registry=None,
)
STORE_ERRORS = Counter(
    "llmmesh_store_errors",
    "SQL store transactions that failed for the database's sake, by store and kind "
    "(unavailable: unreachable or disconnected; conflict: retries exhausted)",
    ["store", "kind"],
    registry=None,
)


def register(registry: CollectorRegistry, *, readiness: bool = True, stores: bool = True) -> None:
    """Serve the shared series a plane has on its own ``registry``."""
    if readiness:
        registry.register(DEPENDENCY_UP)
    if stores:
        registry.register(STORE_ERRORS)

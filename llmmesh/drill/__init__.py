"""Failover drills: ``llmmesh drill failover`` runs steady streaming traffic
through a running mesh's edge, disrupts one part of it (a region, an engine
pod, the global plane, a region's link to the global plane alone, or the
mesh's Redis) and restores it, or rotates
every certificate of the mesh, or its CA, and reports what the clients saw
(:mod:`llmmesh.drill.report` defines every figure).

Modules, in the order a drill uses them: :mod:`~llmmesh.drill.plan` (the
settings), :mod:`~llmmesh.drill.target` (where the mesh is),
:mod:`~llmmesh.drill.setup` (what to disrupt), traffic
(:mod:`~llmmesh.drill.sse_turn`, :mod:`~llmmesh.drill.traffic`),
:mod:`~llmmesh.drill.disruption` (:mod:`~llmmesh.drill.rotation`,
:mod:`~llmmesh.drill.ca_rotation`),
:mod:`~llmmesh.drill.routing_watch`,
:mod:`~llmmesh.drill.tokens`, :mod:`~llmmesh.drill.usage`,
:mod:`~llmmesh.drill.report` and :mod:`~llmmesh.drill.runner`, which runs
the phases. The drill speaks only the mesh's public interfaces: HTTP/SSE at
the edge, and the global plane's and pods' gRPC stubs over mutual TLS.
"""

"""llmmesh: a gRPC-native, multi-region LLM serving mesh, under one import root.

Its packages stand on three floors, and an import only ever points down
(an import-linter layers contract in ``pyproject.toml`` checks it):

- tools: ``llmmesh.cli`` (the command line), ``llmmesh.bench``,
  ``llmmesh.drill``, ``llmmesh.client`` (the gRPC client) and
  ``llmmesh.topology`` (mesh layouts, certificates and the Envoy renderer);
- planes: ``llmmesh.edge``, ``llmmesh.region``, ``llmmesh.globalplane`` and
  ``llmmesh.engine``, which never import one another;
- ground: ``llmmesh.core`` (errors, gRPC plumbing, settings, identity and
  mTLS, stores, tracing) over the generated contract, ``llmmesh.v1``.
"""

import os

__version__ = "0.1.0"

# Every process this package starts is fork-and-exec (subprocess), never a
# fork that goes on using gRPC. gRPC's fork handlers, on by default, run in
# the child between fork and exec, and when another thread of the parent is
# inside gRPC at that moment they skip their work and leave the child's
# poller on the parent's descriptors: the child aborts (SIGABRT) before it
# execs. gRPC's own advice for fork-and-exec programs is to turn them off,
# before gRPC is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

"""``llmmesh bench``: benchmarks that measure a peer in the same run.

The pieces every scenario shares: a seeded chat workload
(:mod:`~llmmesh.bench.workload`), per-request timing and the metrics MISSION
names (:mod:`~llmmesh.bench.stats`), a closed-loop driver
(:mod:`~llmmesh.bench.loadgen`), streaming clients for our gRPC engine
(:mod:`~llmmesh.bench.grpc_client`) and for OpenAI-compatible servers
(:mod:`~llmmesh.bench.openai_client`), child processes
(:mod:`~llmmesh.bench.processes`) and the report (:mod:`~llmmesh.bench.report`).
A scenario (:mod:`~llmmesh.bench.engine`, planned by
:mod:`~llmmesh.bench.plan`) wires them together.
"""

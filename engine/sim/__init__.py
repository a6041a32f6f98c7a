"""A faithful simulator of a vLLM engine: word-level tokenizer, deterministic
output, continuous batching with priorities, chunked prefill under a token
budget, paged KV blocks taken as sequences grow, recompute preemption, prefix
caching, vLLM-style KV events and vLLM-named Prometheus metrics.
:class:`engine.sim.backend.SimBackend` is its one entry point."""

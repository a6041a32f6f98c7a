"""A faithful simulator of a vLLM engine: word-level tokenizer, deterministic
output, continuous batching with priorities, chunked prefill under a token
budget, paged KV blocks taken as sequences grow, recompute preemption, prefix
caching, vLLM-style KV events and vLLM-named Prometheus metrics.

What a client asks of the output is modelled too, and documented where it
is: logit bias, presence and frequency penalties, temperature and log
probabilities act on a stated next-token distribution
(:mod:`engine.sim.distribution`); guided replies (tool calls for a named,
required or auto tool choice, json_object and json_schema content) are
schema-valid JSON written deterministically (:mod:`engine.sim.guided`,
:mod:`engine.sim.json_schema` for the supported schema subset). It is a
model, not a network: the words mean nothing.
:class:`engine.sim.backend.SimBackend` is its one entry point."""

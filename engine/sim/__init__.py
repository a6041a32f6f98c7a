"""A faithful simulator of a vLLM engine: word-level tokenizer, deterministic
output, continuous batching with priorities, paged KV blocks with prefix
caching and vLLM-style KV events. :class:`engine.sim.backend.SimBackend` is
its one entry point."""

"""Placing a turn on one of the region's engine pods: the KV-affinity router
and its prefix indexes (fed by the pods' KV-cache events, or approximate),
hedging for premium tiers, and prefill/decode disaggregation."""

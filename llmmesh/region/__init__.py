"""Region plane: gateway, KV-affinity router, safety, context builder, zone store, metering."""

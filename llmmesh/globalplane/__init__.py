"""Global control plane: policy, billing, model registry, geo-routing. Holds no conversation content."""

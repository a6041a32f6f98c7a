"""Generated protobuf modules of package llmmesh.v1 (scripts/genproto.py)."""

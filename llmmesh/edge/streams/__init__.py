"""Streams a client can leave and resume: the log of each stream's events
(in process, or in Redis shared by the edge's replicas), the hub that
feeds SSE responses from it, and the resume and cancel routes."""

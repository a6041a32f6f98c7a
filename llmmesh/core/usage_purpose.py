"""What metered tokens were spent on (``llmmesh.v1.UsagePurpose``), by name:
a tenant's ``turn``, or the mesh's background work for the tenant's
conversations, a ``summary`` or a ``memory`` extraction."""

from __future__ import annotations

from llmmesh.v1 import billing_service_pb2 as bpb

TURN = "turn"
SUMMARY = "summary"
MEMORY = "memory"

_BY_PROTO: dict[int, str] = {
    bpb.USAGE_PURPOSE_UNSPECIFIED: TURN,
    bpb.USAGE_PURPOSE_TURN: TURN,
    bpb.USAGE_PURPOSE_SUMMARY: SUMMARY,
    bpb.USAGE_PURPOSE_MEMORY: MEMORY,
}
_BY_NAME = {
    TURN: bpb.USAGE_PURPOSE_TURN,
    SUMMARY: bpb.USAGE_PURPOSE_SUMMARY,
    MEMORY: bpb.USAGE_PURPOSE_MEMORY,
}
PURPOSES = (TURN, SUMMARY, MEMORY)


def purpose_name(value: int) -> str:
    """The name of a ``UsagePurpose`` (unspecified is a turn); an unknown
    value is its number, which no :data:`PURPOSES` matches."""
    return _BY_PROTO.get(value, str(value))


def purpose_proto(name: str) -> bpb.UsagePurpose.ValueType:
    """The ``UsagePurpose`` named ``name``, one of :data:`PURPOSES`."""
    return _BY_NAME[name]

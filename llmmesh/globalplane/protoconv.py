"""Conversions between protos and the global plane's domain records, shared by servicers."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf import timestamp_pb2

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.globalplane.region_directory import RegionHealth
from llmmesh.globalplane.tiers import TenantTier
from llmmesh.v1 import common_pb2

_TIER_TO_PROTO: dict[TenantTier, common_pb2.Tier.ValueType] = {
    TenantTier.FREE: common_pb2.TIER_FREE,
    TenantTier.PRO: common_pb2.TIER_PRO,
    TenantTier.ENTERPRISE: common_pb2.TIER_ENTERPRISE,
}
_TIER_FROM_PROTO = {v: k for k, v in _TIER_TO_PROTO.items()}

_HEALTH_TO_PROTO: dict[RegionHealth, common_pb2.HealthState.ValueType] = {
    RegionHealth.SERVING: common_pb2.HEALTH_STATE_SERVING,
    RegionHealth.DEGRADED: common_pb2.HEALTH_STATE_DEGRADED,
    RegionHealth.DRAINING: common_pb2.HEALTH_STATE_DRAINING,
    RegionHealth.DOWN: common_pb2.HEALTH_STATE_DOWN,
}
_HEALTH_FROM_PROTO = {v: k for k, v in _HEALTH_TO_PROTO.items()}


def timestamp(moment: datetime) -> timestamp_pb2.Timestamp:
    """An aware datetime as a Timestamp."""
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def datetime_of(stamp: timestamp_pb2.Timestamp) -> datetime:
    """A Timestamp as an aware UTC datetime."""
    return stamp.ToDatetime(tzinfo=UTC)


def tier_to_proto(tier: TenantTier) -> common_pb2.Tier.ValueType:
    return _TIER_TO_PROTO[tier]


def tier_from_proto(tier: common_pb2.Tier.ValueType, param: str = "tier") -> TenantTier | None:
    """The tenant tier, ``None`` when unset; INVALID_ARGUMENT for an unknown number."""
    if tier == common_pb2.TIER_UNSPECIFIED:
        return None
    if tier not in _TIER_FROM_PROTO:
        raise InvalidArgument(Reason.INVALID_REQUEST, f"unknown tier {tier}", metadata={"param": param})
    return _TIER_FROM_PROTO[tier]


def required_tier(tier: common_pb2.Tier.ValueType, param: str = "tier") -> TenantTier:
    """The tenant tier; INVALID_ARGUMENT when unset or unknown."""
    parsed = tier_from_proto(tier, param)
    if parsed is None:
        raise InvalidArgument(Reason.INVALID_REQUEST, f"{param} must be set", metadata={"param": param})
    return parsed


def health_to_proto(health: RegionHealth) -> common_pb2.HealthState.ValueType:
    return _HEALTH_TO_PROTO[health]


def health_from_proto(health: common_pb2.HealthState.ValueType) -> RegionHealth:
    """The region health; INVALID_ARGUMENT when unset or unknown."""
    if health not in _HEALTH_FROM_PROTO:
        raise InvalidArgument(
            Reason.INVALID_REQUEST, "health must be set to a known state", metadata={"param": "health"}
        )
    return _HEALTH_FROM_PROTO[health]

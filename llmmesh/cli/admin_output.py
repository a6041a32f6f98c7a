"""What every ``llmmesh admin`` command shares: the call timeout, tier
names, the one-line error, and how tables and JSON are printed."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from typing import Any

from google.protobuf import json_format, timestamp_pb2
from google.protobuf.message import Message

from llmmesh.v1 import common_pb2
from llmmesh.v1 import policy_service_pb2 as ppb

CALL_TIMEOUT_S = 10.0
_TIERS = {"free": common_pb2.TIER_FREE, "pro": common_pb2.TIER_PRO, "enterprise": common_pb2.TIER_ENTERPRISE}
_TIER_NAMES = {v: k for k, v in _TIERS.items()}


class AdminError(Exception):
    """A failure to report as one line, with its reason and exit status."""

    def __init__(self, message: str, reason: str, status: int) -> None:
        super().__init__(message)
        self.message, self.reason, self.status = message, reason, status


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def _as_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _limit(value: int) -> str:
    return str(value) if value else "unlimited"


def _time(stamp: timestamp_pb2.Timestamp) -> str:
    return stamp.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%SZ") if stamp.seconds else "-"


def _tenant_rows(tenants: Sequence[ppb.Tenant]) -> str:
    rows = [
        (
            t.name,
            t.id,
            t.zone,
            _TIER_NAMES.get(t.tier, "?"),
            _limit(t.rpm_limit),
            _limit(t.tpm_limit),
            _limit(t.monthly_token_quota),
            ",".join(t.allowed_models) or "all",
        )
        for t in tenants
    ]
    return _table(("NAME", "ID", "ZONE", "TIER", "RPM", "TPM", "MONTHLY QUOTA", "MODELS"), rows)

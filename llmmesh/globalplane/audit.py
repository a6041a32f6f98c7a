"""The audit log: every administrative change to tenants, keys and models,
who made it (the caller's mesh identity) and what it asked for, in the
global store. Secrets are never written: an API key's secret is redacted."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from google.protobuf import json_format
from google.protobuf.message import Message
from sqlalchemy.engine import Connection

from llmmesh.core.access import current_caller
from llmmesh.globalplane import schema
from llmmesh.globalplane.clock import Clock, utc_now
from llmmesh.globalplane.store import GlobalStore

log = logging.getLogger(__name__)

_SECRET_FIELDS = frozenset({"secret"})
INSECURE_ACTOR = "insecure"


@dataclass(frozen=True)
class AuditEvent:
    """One administrative change."""

    id: int
    event_time: datetime
    actor: str
    method: str
    target: str
    request_fields: dict[str, Any]


def _fields_of(request: Message) -> dict[str, Any]:
    fields: dict[str, Any] = _redacted(json_format.MessageToDict(request, preserving_proto_field_name=True))
    return fields


def _redacted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ("<redacted>" if k in _SECRET_FIELDS else _redacted(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


class AuditLog:
    """Appends and lists audit events."""

    def __init__(self, store: GlobalStore, clock: Clock = utc_now) -> None:
        self._store = store
        self._clock = clock

    async def record(self, method: str, target: str, request: Message) -> None:
        caller = current_caller()
        actor = caller.identity.uri if caller.identity is not None else INSECURE_ACTOR
        row = {
            "event_time": self._clock(),
            "actor": actor,
            "method": method,
            "target": target[:128],
            "request_fields": _fields_of(request),
        }

        def write(conn: Connection) -> None:
            conn.execute(sa.insert(schema.audit_events).values(**row))

        await self._store.transaction(write)
        log.info("audit: %s by %s on %s", method, actor, target)

    async def list(self, page_size: int, after_id: int = 0) -> list[AuditEvent]:
        """Events after ``after_id``, oldest first, at most ``page_size``."""
        t = schema.audit_events

        def read(conn: Connection) -> list[AuditEvent]:
            rows = conn.execute(sa.select(t).where(t.c.id > after_id).order_by(t.c.id).limit(page_size))
            return [
                AuditEvent(r.id, r.event_time, r.actor, r.method, r.target, dict(r.request_fields))
                for r in rows
            ]

        return await self._store.transaction(read)

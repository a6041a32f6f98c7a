"""A region's local spool of turn records the zone store has not taken yet.

:class:`region.lifecycle.retry.RecordRetries` keeps retrying a refused
record while the region runs; the spool keeps it across a restart. A turn
record waiting for the store is appended to a JSON-lines file beside the
region's other local state (fsynced), removed once the store has it, and
retried again when the region starts. The file holds conversation content,
like the zone store: it lives on the region's own disk, in the zone.

A continuation (a turn another region began, continued here after that
region failed) is spooled too: its usage rows depend on what its original
turn's rows hold when it is written, so it keeps what makes them (one usage
record of the turn, :func:`usage_rows`) and what it delivered
(:class:`~region.zone_store.rows.ContinuedTurn`), and is written as
:meth:`ZoneStore.record_continuation` writes it then.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from llmmesh.region.zone_store.rows import (
    AssistantMessage,
    ContinuedTurn,
    ToolCallRow,
    ToolResult,
    TurnRecord,
)
from llmmesh.region.zone_store.store import UsageEncoder, ZoneStore
from llmmesh.v1 import billing_service_pb2

log = logging.getLogger(__name__)


def usage_rows(template: bytes) -> UsageEncoder:
    """The usage rows of one turn (``request_id``, input and output
    tokens, the request id it continues): ``template``, a serialized
    ``UsageRecord`` of the turn, with those put in and its cached input
    tokens capped at the row's input."""
    base = billing_service_pb2.UsageRecord.FromString(template)

    def encode(request_id: str, input_tokens: int, output_tokens: int, continues: str = "") -> bytes:
        row = billing_service_pb2.UsageRecord()
        row.CopyFrom(base)
        row.request_id = request_id
        row.usage.input_tokens = input_tokens
        row.usage.output_tokens = output_tokens
        row.usage.cached_input_tokens = min(base.usage.cached_input_tokens, input_tokens)
        row.continues_request_id = continues
        return row.SerializeToString()

    return encode


@dataclass(frozen=True)
class SpooledTurn:
    """Everything :meth:`ZoneStore.record_turn` takes for one turn; for a
    continuation (``continued``), what :meth:`ZoneStore.record_continuation`
    takes: ``usage`` is then the template of its usage rows
    (:func:`usage_rows`) and ``output_tokens`` what this part delivered."""

    tenant_id: str
    conversation_id: str | None
    request_id: str
    user_message: str | None
    assistant: AssistantMessage
    usage: bytes
    tokens: int
    tool_results: tuple[ToolResult, ...] = ()
    parent_id: str | None = None
    continued: ContinuedTurn | None = None
    output_tokens: int = 0

    async def write(self, store: ZoneStore) -> TurnRecord:
        if self.continued is not None:
            return await store.record_continuation(
                self.tenant_id,
                self.conversation_id,
                self.request_id,
                self.user_message,
                self.continued,
                self.assistant,
                self.output_tokens,
                usage_rows(self.usage),
                self.tool_results,
                self.parent_id,
            )
        return await store.record_turn(
            self.tenant_id,
            self.conversation_id,
            self.request_id,
            self.user_message,
            self.assistant,
            self.usage,
            tokens=self.tokens,
            tool_results=self.tool_results,
            parent_id=self.parent_id,
        )

    def to_json(self) -> str:
        data: dict[str, Any] = asdict(self)
        data["usage"] = base64.b64encode(self.usage).decode("ascii")
        data["assistant"]["cost_usd"] = str(self.assistant.cost_usd)
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SpooledTurn:
        data = json.loads(text)
        reply = data["assistant"]
        assistant = AssistantMessage(
            **(
                reply
                | {
                    "cost_usd": Decimal(reply["cost_usd"]),
                    "tool_calls": tuple(ToolCallRow(**c) for c in reply["tool_calls"]),
                }
            )
        )
        return cls(
            data["tenant_id"],
            data["conversation_id"],
            data["request_id"],
            data["user_message"],
            assistant,
            base64.b64decode(data["usage"]),
            data["tokens"],
            tuple(ToolResult(**r) for r in data["tool_results"]),
            data["parent_id"],
            ContinuedTurn(**data["continued"]) if data.get("continued") else None,
            data.get("output_tokens", 0),
        )

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant_id, self.request_id)


class RecordSpool:
    """The JSON-lines file ``path`` of spooled turn records."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def add(self, turn: SpooledTurn) -> None:
        """Append ``turn``, on disk before this returns."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as spool:
                spool.write(turn.to_json() + "\n")
                spool.flush()
                os.fsync(spool.fileno())

    def remove(self, turn: SpooledTurn) -> None:
        """Drop ``turn`` (the store has it), replacing the file at once."""
        with self._lock:
            kept = [t for t in self._read() if t.key != turn.key]
            if not kept:
                self.path.unlink(missing_ok=True)
                return
            fresh = self.path.with_suffix(".tmp")
            fresh.write_text("".join(t.to_json() + "\n" for t in kept), encoding="utf-8")
            os.replace(fresh, self.path)

    def load(self) -> list[SpooledTurn]:
        """The spooled records, each once."""
        with self._lock:
            return self._read()

    def _read(self) -> list[SpooledTurn]:
        if not self.path.exists():
            return []
        found: dict[tuple[str, str], SpooledTurn] = {}
        for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                turn = SpooledTurn.from_json(line)
            except (ValueError, KeyError, TypeError):
                # A line cut short by a crash mid-append: its turn was never acknowledged as spooled.
                log.error("%s line %d is not a turn record; skipped", self.path, n)
                continue
            found[turn.key] = turn
        return list(found.values())

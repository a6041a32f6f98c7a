"""A region's local spool of turn records the zone store has not taken yet.

:class:`region.lifecycle_retry.RecordRetries` keeps retrying a refused
record while the region runs; the spool keeps it across a restart. A turn
record waiting for the store is appended to a JSON-lines file beside the
region's other local state (fsynced), removed once the store has it, and
retried again when the region starts. The file holds conversation content,
like the zone store: it lives on the region's own disk, in the zone.

Only a turn of its own is spooled; a continuation's record is derived from
its original turn's rows at write time and is retried in memory only.
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

from region.zone_store.rows import AssistantMessage, ToolCallRow, ToolResult, TurnRecord
from region.zone_store.store import ZoneStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpooledTurn:
    """Everything :meth:`ZoneStore.record_turn` takes for one turn."""

    tenant_id: str
    conversation_id: str | None
    request_id: str
    user_message: str | None
    assistant: AssistantMessage
    usage: bytes
    tokens: int
    tool_results: tuple[ToolResult, ...] = ()
    parent_id: str | None = None

    async def write(self, store: ZoneStore) -> TurnRecord:
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

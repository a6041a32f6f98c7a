"""Turn records that must not be lost: a write the zone store refused is tried again.

A turn that streamed was accepted and billed-for tokens were delivered: its
messages and usage row must reach the zone store even when the store is
briefly down. The gateway writes the record once while the caller waits
for its finish event; when that fails it hands the write here and finishes
the stream (without a message id). :class:`RecordRetries` tries again in
the background, waiting longer after each failure (up to ``max_delay_s``),
until the store takes it.

Retrying is safe: a turn's record is keyed by its tenant and request id, so
a write that landed although its answer was lost makes the retry a no-op.
A region that stops waits a little for the writes still pending and names
each one it has to leave behind in its log; with a spool
(:mod:`region.lifecycle.spool`) those stay on disk and the next start
retries them (:meth:`RecordRetries.resume`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from llmmesh.region.lifecycle.spool import RecordSpool, SpooledTurn
from llmmesh.region.zone_store.store import ZoneStore

log = logging.getLogger(__name__)

Write = Callable[[], Awaitable[object]]


class RecordRetries:
    """Turn-record writes being retried, by request id."""

    def __init__(
        self,
        *,
        first_delay_s: float = 0.2,
        max_delay_s: float = 10.0,
        max_attempts: int = 1000,
        on_recorded: Callable[[], None] = lambda: None,
        spool: RecordSpool | None = None,
    ) -> None:
        """``max_attempts`` bounds each write's retries (at ``max_delay_s``
        apart, the default keeps trying for hours); ``on_recorded`` runs after
        each write that lands (the usage shipper's wake-up); ``spool`` keeps
        the spoolable records across a restart (:meth:`resume`)."""
        self._spool = spool
        self._first = first_delay_s
        self._most = max_delay_s
        self._attempts = max_attempts
        self._on_recorded = on_recorded
        self._pending: dict[str, asyncio.Task[bool]] = {}

    @property
    def pending(self) -> int:
        """Writes not landed yet."""
        return len(self._pending)

    def keep(
        self, name: str, write: Write, spooled: SpooledTurn | None = None, *, on_disk: bool = False
    ) -> asyncio.Task[bool]:
        """Retry ``write`` (the record of turn ``name``) until it lands; the
        task says whether it did. A write already kept under ``name`` stays.
        ``spooled`` is the record as the spool keeps it, if it can (``on_disk``:
        the spool holds it already)."""
        if name in self._pending:
            return self._pending[name]
        task = asyncio.create_task(self._retry(name, write, spooled if self._spool else None, on_disk))
        self._pending[name] = task
        task.add_done_callback(lambda _: self._pending.pop(name, None))
        return task

    async def drain(self, timeout_s: float) -> None:
        """Give the pending writes ``timeout_s`` to land, then stop them, naming each in the log."""
        if not self._pending:
            return
        tasks = list(self._pending.items())
        _, unfinished = await asyncio.wait([t for _, t in tasks], timeout=timeout_s)
        for name, task in tasks:
            if task in unfinished:
                task.cancel()
                log.error("turn %s: its record was never written; the zone store stayed down", name)
        if unfinished:
            await asyncio.wait(unfinished)

    def resume(self, store: ZoneStore) -> int:
        """Retry the records a previous run of the region left in the spool; how many."""
        if self._spool is None:
            return 0
        found = self._spool.load()
        for turn in found:
            log.warning(
                "turn %s: retrying the record a previous run left in %s", turn.request_id, self._spool.path
            )
            self.keep(turn.request_id, functools.partial(turn.write, store), turn, on_disk=True)
        return len(found)

    async def _retry(self, name: str, write: Write, spooled: SpooledTurn | None, on_disk: bool) -> bool:
        if spooled is not None and self._spool is not None and not on_disk:
            await asyncio.to_thread(self._spool.add, spooled)
        landed = await self._attempts_of(name, write)
        if landed and spooled is not None and self._spool is not None:
            await asyncio.to_thread(self._spool.remove, spooled)
        return landed

    async def _attempts_of(self, name: str, write: Write) -> bool:
        delay = self._first
        for attempt in range(1, self._attempts + 1):
            await asyncio.sleep(delay)
            try:
                await write()
            except Exception as err:
                log.warning("turn %s: writing its record failed again (attempt %d): %s", name, attempt, err)
                delay = min(delay * 2, self._most)
                continue
            log.info("turn %s: its record was written after %d retries", name, attempt)
            self._on_recorded()
            return True
        log.error("turn %s: its record was never written after %d retries", name, self._attempts)
        return False

"""Ships usage records to the global BillingService, retrying with backoff.

Billing ingests idempotently by request id, so a shipment that is repeated
after a lost reply is never counted twice. Records wait here while the
global plane is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from llmmesh.tasks import cancel_and_wait
from llmmesh.v1 import billing_service_pb2, billing_service_pb2_grpc

log = logging.getLogger(__name__)


class UsageOutbox:
    """An in-process outbox of usage records awaiting delivery to billing."""

    def __init__(
        self,
        stub: billing_service_pb2_grpc.BillingServiceStub,
        batch_size: int = 100,
        min_backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
    ) -> None:
        self._stub = stub
        self._pending: dict[str, billing_service_pb2.UsageRecord] = {}
        self._wakeup = asyncio.Event()
        self._batch_size = batch_size
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max_backoff_s
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, record: billing_service_pb2.UsageRecord) -> None:
        """Queue a record; the same request id is queued once."""
        self._pending.setdefault(record.request_id, record)
        self._wakeup.set()

    async def flush_once(self) -> bool:
        """Try to deliver one batch; False when billing could not be reached."""
        batch = list(self._pending.values())[: self._batch_size]
        if not batch:
            return True
        try:
            await self._stub.RecordUsage(billing_service_pb2.RecordUsageRequest(records=batch), timeout=5.0)
        except grpc.aio.AioRpcError as err:
            log.warning("usage shipment of %d records failed: %s", len(batch), err.code().name)
            return False
        for record in batch:
            self._pending.pop(record.request_id, None)
        self.delivered += len(batch)
        return True

    async def _run(self) -> None:
        backoff = self._min_backoff_s
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            if await self.flush_once():
                backoff = self._min_backoff_s
            else:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="usage-outbox")

    async def close(self, drain_timeout_s: float = 3.0) -> None:
        """Stop, after trying for a while to deliver what is pending."""
        await cancel_and_wait(self._task)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_timeout_s):
                while self._pending and await self.flush_once():
                    pass
        if self._pending:
            log.error("%d usage records were not delivered before shutdown", len(self._pending))

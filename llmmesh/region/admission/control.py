"""Admitting a chat turn: the key's rate limits, the tenant's monthly quota,
then a slot from the weighted fair queue, in that order (cheapest refusal
first). What a turn holds is given back once, by :meth:`Admitted.close`.

When the shared Redis behind the rate limits cannot be reached, the gateway
keeps serving on an in-process limiter with the same limits: each replica
then enforces them alone, so a key may get up to one window's worth per
replica until Redis is back. Refusing every turn instead would turn a cache
outage into a region outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis.exceptions

from llmmesh.core.errors import MeshError
from llmmesh.region import metrics as region_metrics
from llmmesh.region.admission.fair_queue import FairQueue, Ticket, tier_name
from llmmesh.region.admission.quota import QuotaHold, QuotaLedger
from llmmesh.region.admission.ratelimit import LocalRateLimiter, RateLimiter, RateLimits, Reservation
from llmmesh.region.policy_cache import Caller

log = logging.getLogger(__name__)

# Shared-limiter failures are logged at most this often.
_WARN_EVERY_S = 10.0
# After a failure of the shared limiter, turns skip it for this long.
_RETRY_SHARED_S = 5.0


@dataclass
class Admitted:
    """What an admitted turn holds: its rate-limit reservation (``x-ratelimit-*``
    figures), its quota hold and its queue slot."""

    reservation: Reservation
    limiter: RateLimiter = field(repr=False)
    quota_hold: QuotaHold = field(repr=False)
    ticket: Ticket | None = field(repr=False)
    _admission: Admission | None = field(default=None, repr=False)

    def release_slot(self) -> None:
        """Give the queue slot back (the turn's engine work is over)."""
        if self._admission is not None and self.ticket is not None:
            self._admission.queue.release(self.ticket)

    async def settle(self, actual_tokens: int) -> None:
        """Swap the TPM reservation for the tokens the turn used."""
        await _settle(self.limiter, self.reservation, actual_tokens)

    def release_quota(self) -> None:
        """Stop holding quota for the turn (its usage is recorded, or never will be)."""
        if self._admission is not None:
            self._admission.quota.release(self.quota_hold)


class Admission:
    """Rate limits, quota and fair queueing of one region's turns."""

    def __init__(
        self,
        limiter: RateLimiter,
        quota: QuotaLedger,
        queue: FairQueue,
        *,
        fallback: RateLimiter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limiter = limiter
        self.quota = quota
        self.queue = queue
        self._fallback = fallback or LocalRateLimiter(window_s=limiter.window_s)
        self._clock = clock
        self._warned_at = -_WARN_EVERY_S
        self._shared_down_until = 0.0
        # Turns waiting for a slot, by the model they are for; and the
        # refusal of each one :meth:`refuse_waiting` released.
        self._waiting: dict[asyncio.Task[Ticket], str] = {}
        self._refused: dict[asyncio.Task[Ticket], MeshError] = {}

    def refuse_waiting(self, refusal: Callable[[str], MeshError | None]) -> int:
        """Release every turn waiting for a slot whose model ``refusal`` gives
        an error for (say, no engine pod of it is left): its :meth:`admit`
        raises that error instead of waiting on. Returns how many it released."""
        released = 0
        for acquiring, model in list(self._waiting.items()):
            error = refusal(model)
            if error is not None and not acquiring.done() and acquiring not in self._refused:
                self._refused[acquiring] = error
                acquiring.cancel()
                released += 1
        return released

    async def admit(
        self, caller: Caller, tokens: int, deadline_s: float | None, model: str = "", *, slot: bool = True
    ) -> Admitted:
        """Reserve ``tokens`` (prompt plus the most output the turn may
        produce) against the key's RPM/TPM limits and the tenant's quota, then
        wait for a slot. Raises ResourceExhausted (RATE_LIMITED,
        QUOTA_EXCEEDED or OVERLOADED, with RetryInfo where waiting helps),
        having given back whatever it took. RATE_LIMITED carries the key's
        ``x-ratelimit-*`` figures as ErrorInfo metadata, named in
        :meth:`RateLimiter.reserve`. A turn still waiting for a slot when
        :meth:`refuse_waiting` refuses its ``model`` raises that refusal.

        ``slot=False`` takes no queue slot: the queue's capacity is the chat
        pods' batch slots, so work no chat pod does (embeddings, moderation)
        must not wait on it, or it would wait forever with every chat pod down."""
        try:
            return await self._admit(caller, tokens, deadline_s, model, slot)
        except MeshError as refused:
            region_metrics.admission_refused(refused)
            raise

    async def _admit(
        self, caller: Caller, tokens: int, deadline_s: float | None, model: str, slot: bool
    ) -> Admitted:
        limits = RateLimits(rpm=max(0, caller.tenant.rpm_limit), tpm=max(0, caller.tenant.tpm_limit))
        limiter = self.limiter if self._clock() >= self._shared_down_until else self._fallback
        try:
            reservation = await limiter.reserve(caller.key_id, limits, tokens)
        except redis.exceptions.RedisError as err:
            self._shared_down_until = self._clock() + _RETRY_SHARED_S
            self._warn(f"shared rate limits unavailable, limiting in this process: {err}")
            limiter = self._fallback
            reservation = await limiter.reserve(caller.key_id, limits, tokens)
        try:
            hold = await self.quota.hold(caller, tokens)
        except BaseException:
            await _settle(limiter, reservation, 0)
            raise
        if not slot:
            return Admitted(reservation, limiter, hold, None, self)
        queued_at = self._clock()
        try:
            ticket = await self._acquire(tier_name(caller.tier), deadline_s, model)
            region_metrics.admission_waited(tier_name(caller.tier), self._clock() - queued_at)
        except BaseException:
            self.quota.release(hold)
            await _settle(limiter, reservation, 0)
            raise
        return Admitted(reservation, limiter, hold, ticket, self)

    async def _acquire(self, tier: str, deadline_s: float | None, model: str) -> Ticket:
        """A queue slot, or the refusal :meth:`refuse_waiting` gave the wait."""
        acquiring = asyncio.ensure_future(self.queue.acquire(tier, deadline_s))
        self._waiting[acquiring] = model
        try:
            return await acquiring
        except asyncio.CancelledError:
            if acquiring.done() and not acquiring.cancelled() and acquiring.exception() is None:
                # Granted just as this turn was cancelled: pass the slot on.
                self.queue.release(acquiring.result())
            refusal = self._refused.get(acquiring)
            current = asyncio.current_task()
            if refusal is None or (current is not None and current.cancelling()):
                raise
            raise refusal from None
        finally:
            self._waiting.pop(acquiring, None)
            self._refused.pop(acquiring, None)

    def _warn(self, message: str) -> None:
        now = self._clock()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning("%s", message)


async def _settle(limiter: RateLimiter, reservation: Reservation, actual_tokens: int) -> None:
    # A settle that cannot reach Redis leaves the reservation standing until
    # it leaves the window: the key is limited a little early, nothing worse.
    with contextlib.suppress(redis.exceptions.RedisError):
        await limiter.settle(reservation, actual_tokens)

"""Per-API-key request (RPM) and token (TPM) rate limits.

Algorithm: fixed sub-buckets summed over a sliding window. Time is cut into
``buckets`` sub-buckets of ``bucket_s = window_s / buckets`` (1 s for the
default 60 s window). Each key keeps, per sub-bucket, how many requests it
admitted and how many tokens they hold. A reservation is admitted when the
current sub-bucket plus the ``buckets`` before it leave room for one more
request and for its tokens. That span reaches back between ``window_s`` and
``window_s + bucket_s``, so it always covers the last ``window_s`` whole.

Error bound, for each limit:

- Never over: any ``window_s`` span holds at most ``rpm`` admitted requests
  and at most ``tpm`` tokens counted at the moment of each admission.
- Under by at most one sub-bucket of time: room used at time t comes back
  between ``t + window_s`` and ``t + window_s + bucket_s``. A client that sends
  at exactly the limit rate is therefore refused at most ``ceil(limit /
  buckets)`` times per window. That is within one request's worth whenever the
  limit is no larger than ``buckets`` (60 rpm at the defaults), and always
  within one sub-bucket's worth. ``retry_after_s`` is exact, not an estimate:
  it is the moment the oldest sub-buckets holding enough of the limit leave
  the span.
- Tokens are reserved up front (prompt plus ``max_tokens``). :meth:`settle`
  then swaps the reservation for the actual count. Unused tokens come back at
  once. An overrun is added to the window, which may then exceed ``tpm`` by
  that overrun, and later requests are refused until it drains.

Sub-buckets, not an interpolated two-window counter: interpolation assumes
uniform traffic inside the previous window and can over-admit a burst. The
cost is ``buckets + 1`` small counters per active key.

:class:`region.admission.ratelimit_redis.RedisRateLimiter` keeps each key's counters in one Redis hash
(``r:<bucket>`` and ``t:<bucket>`` fields) and decides in a Lua script. The
script reads Redis's own clock, so any number of gateway replicas share one
exact count no matter how their clocks drift. The hash expires once its
newest sub-bucket has left the window. :class:`LocalRateLimiter` runs the same
algorithm in process, for the embedded mesh and for tests.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from llmmesh.core.errors import Reason, ResourceExhausted

_US = 1_000_000


@dataclass(frozen=True)
class RateLimits:
    """One API key's limits per window; 0 means unlimited."""

    rpm: int = 0
    tpm: int = 0

    def __post_init__(self) -> None:
        if self.rpm < 0 or self.tpm < 0:
            raise ValueError(f"rate limits must be >= 0, got rpm={self.rpm} tpm={self.tpm}")

    @property
    def unlimited(self) -> bool:
        return self.rpm == 0 and self.tpm == 0


@dataclass
class Reservation:
    """One admitted request's claim on its key's window, and what OpenAI's
    ``x-ratelimit-*`` headers report after it. A limit of 0 (unlimited)
    reports 0 as its limit and remaining, and the edge leaves those headers
    out. ``reset_*_s`` is the time until the window holds none of the usage it
    counts now, which is OpenAI's "resets to its initial state"."""

    key_id: str
    reserved_tokens: int
    limit_requests: int
    remaining_requests: int
    limit_tokens: int
    remaining_tokens: int
    reset_requests_s: float
    reset_tokens_s: float
    # The sub-bucket this reservation was counted in; -1 when it was not counted.
    bucket: int = field(default=-1, repr=False)
    settled: bool = field(default=False, repr=False)


@dataclass(frozen=True)
class _Window:
    """The sub-bucket geometry, in integer microseconds so that Python and Lua
    agree on every boundary."""

    window_s: float
    buckets: int
    bucket_us: int

    @classmethod
    def make(cls, window_s: float, buckets: int) -> _Window:
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {buckets}")
        bucket_us = round(window_s * _US / buckets)
        if bucket_us < 1000:
            raise ValueError(f"a sub-bucket must last at least 1 ms, got {window_s}s / {buckets}")
        return cls(window_s, buckets, bucket_us)

    def current(self, now_us: int) -> int:
        return now_us // self.bucket_us

    def expired(self, bucket: int, now_us: int) -> bool:
        return bucket < self.current(now_us) - self.buckets

    def leaves_at_us(self, bucket: int) -> int:
        """When ``bucket`` stops being counted."""
        return (bucket + self.buckets + 1) * self.bucket_us

    @property
    def ttl_ms(self) -> int:
        return math.ceil((self.buckets + 2) * self.bucket_us / 1000)

    def describe(self) -> str:
        return "minute" if self.window_s == 60 else f"{self.window_s:g} s"


@dataclass(frozen=True)
class _Outcome:
    """One reserve decision: counts and resets are after the admission, or as
    found when ``refused`` names the limit that would be exceeded."""

    refused: str
    bucket: int
    used_requests: int
    used_tokens: int
    wait_us: int
    reset_requests_us: int
    reset_tokens_us: int


def _ceil_ms(us: int) -> float:
    """Microseconds as seconds rounded up to whole milliseconds, so that
    RetryInfo (milliseconds) never says 0 or a moment too early."""
    return math.ceil(us / 1000) / 1000


class RateLimiter(ABC):
    """Counts requests and tokens per API key against :class:`RateLimits`."""

    def __init__(self, *, window_s: float = 60.0, buckets: int = 60) -> None:
        self._window = _Window.make(window_s, buckets)

    @property
    def window_s(self) -> float:
        return self._window.window_s

    async def reserve(self, key_id: str, limits: RateLimits, tokens: int) -> Reservation:
        """Count one request and reserve ``tokens`` for it, atomically.

        Raises ResourceExhausted(RATE_LIMITED) with ``retry_after_s`` when
        either limit would be exceeded, changing nothing. Its ErrorInfo
        metadata (all values strings):

        - ``limit``: the limit that refused, ``requests`` or ``tokens``;
          ``limit_value``: that limit; ``requested``: the tokens asked for
          (a token refusal only).
        - The key's figures as the refusal found them, what OpenAI's
          ``x-ratelimit-*`` headers report on a 429: ``limit_requests``,
          ``remaining_requests``, ``reset_requests_ms``, ``limit_tokens``,
          ``remaining_tokens``, ``reset_tokens_ms``. They read as
          :class:`Reservation`'s do (a limit of 0 is unlimited; a reset is the
          time until the window holds none of the usage it counts now), but
          nothing of the refused request is counted: remaining requests are 0
          on a request refusal, and remaining tokens are what is left, which
          on a token refusal is less than ``requested``.

        A request of more tokens than the whole TPM limit can never pass: it
        is refused without RetryInfo and without the key's figures, as it is
        refused before its key's window is read.
        """
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        if limits.unlimited:
            return Reservation(key_id, tokens, 0, 0, 0, 0, 0.0, 0.0)
        if limits.tpm and tokens > limits.tpm:
            raise ResourceExhausted(
                Reason.RATE_LIMITED,
                f"this request needs up to {tokens} tokens (prompt plus max_tokens) but the API key "
                f"may use {limits.tpm} tokens per {self._window.describe()}; "
                "lower max_tokens or shorten the prompt",
                metadata={"limit": "tokens", "limit_value": str(limits.tpm), "requested": str(tokens)},
            )
        outcome = await self._reserve(key_id, limits, tokens)
        if outcome.refused:
            raise self._refusal(limits, tokens, outcome)
        return Reservation(
            key_id=key_id,
            reserved_tokens=tokens,
            limit_requests=limits.rpm,
            remaining_requests=_remaining(limits.rpm, outcome.used_requests),
            limit_tokens=limits.tpm,
            remaining_tokens=_remaining(limits.tpm, outcome.used_tokens),
            reset_requests_s=_ceil_ms(outcome.reset_requests_us),
            reset_tokens_s=_ceil_ms(outcome.reset_tokens_us),
            bucket=outcome.bucket,
        )

    async def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        """Replace the reserved token count with ``actual_tokens``.

        Only the first call per reservation counts; later ones do nothing.
        Once the reservation's sub-bucket has left the window its tokens no
        longer count, and settling changes nothing, so it cannot touch a
        later window.
        """
        if actual_tokens < 0:
            raise ValueError(f"actual_tokens must be >= 0, got {actual_tokens}")
        if reservation.settled:
            return
        reservation.settled = True
        delta = actual_tokens - reservation.reserved_tokens
        if reservation.bucket >= 0 and delta != 0:
            await self._settle(reservation.key_id, reservation.bucket, delta)

    @abstractmethod
    async def _reserve(self, key_id: str, limits: RateLimits, tokens: int) -> _Outcome:
        """Decide and, if admitted, count; atomically."""

    @abstractmethod
    async def _settle(self, key_id: str, bucket: int, delta: int) -> None:
        """Add ``delta`` tokens to ``bucket`` (never below 0) unless it has left the window."""

    def _refusal(self, limits: RateLimits, tokens: int, outcome: _Outcome) -> ResourceExhausted:
        wait_s = _ceil_ms(outcome.wait_us)
        per = self._window.describe()
        if outcome.refused == "requests":
            message = f"rate limit of {limits.rpm} requests per {per} reached for this API key"
            metadata = {"limit": "requests", "limit_value": str(limits.rpm)}
        else:
            message = (
                f"rate limit of {limits.tpm} tokens per {per} reached for this API key: "
                f"{outcome.used_tokens} in use, {tokens} requested"
            )
            metadata = {"limit": "tokens", "limit_value": str(limits.tpm), "requested": str(tokens)}
        return ResourceExhausted(
            Reason.RATE_LIMITED,
            f"{message}; retry in {wait_s:.3f} s",
            metadata={**metadata, **_refusal_figures(limits, outcome)},
            retry_after_s=wait_s,
        )


def _refusal_figures(limits: RateLimits, outcome: _Outcome) -> dict[str, str]:
    """The key's ``x-ratelimit-*`` figures as a refusal found them, as ErrorInfo metadata."""
    return {
        "limit_requests": str(limits.rpm),
        "remaining_requests": str(_remaining(limits.rpm, outcome.used_requests)),
        "reset_requests_ms": str(math.ceil(outcome.reset_requests_us / 1000)),
        "limit_tokens": str(limits.tpm),
        "remaining_tokens": str(_remaining(limits.tpm, outcome.used_tokens)),
        "reset_tokens_ms": str(math.ceil(outcome.reset_tokens_us / 1000)),
    }


def _remaining(limit: int, used: int) -> int:
    """Room left under ``limit``; 0 for an unlimited one, as the headers leave it out."""
    return max(0, limit - used) if limit else 0


class _KeyCounts:
    """One key's sub-bucket counters, for :class:`LocalRateLimiter`; the
    Python twin of the Lua script in :class:`RedisRateLimiter`."""

    def __init__(self) -> None:
        self.requests: dict[int, int] = {}
        self.tokens: dict[int, int] = {}

    def prune(self, oldest: int) -> None:
        for counts in (self.requests, self.tokens):
            for bucket in [b for b in counts if b < oldest]:
                del counts[bucket]

    def decide(self, window: _Window, now_us: int, limits: RateLimits, tokens: int) -> _Outcome:
        current = window.current(now_us)
        self.prune(current - window.buckets)
        used_r, used_t = sum(self.requests.values()), sum(self.tokens.values())
        wait_r = wait_t = 0
        if limits.rpm and used_r + 1 > limits.rpm:
            wait_r = _free_in_us(self.requests, used_r + 1 - limits.rpm, window, now_us)
        if limits.tpm and used_t + tokens > limits.tpm:
            wait_t = _free_in_us(self.tokens, used_t + tokens - limits.tpm, window, now_us)
        if wait_r or wait_t:
            refused = "requests" if wait_r >= wait_t else "tokens"
            return _Outcome(
                refused,
                current,
                used_r,
                used_t,
                max(wait_r, wait_t),
                _empty_in_us(self.requests, window, now_us),
                _empty_in_us(self.tokens, window, now_us),
            )
        self.requests[current] = self.requests.get(current, 0) + 1
        if tokens:
            self.tokens[current] = self.tokens.get(current, 0) + tokens
        return _Outcome(
            "",
            current,
            used_r + 1,
            used_t + tokens,
            0,
            _empty_in_us(self.requests, window, now_us),
            _empty_in_us(self.tokens, window, now_us),
        )

    def adjust_tokens(self, bucket: int, delta: int) -> None:
        left = self.tokens.get(bucket, 0) + delta
        if left > 0:
            self.tokens[bucket] = left
        else:
            self.tokens.pop(bucket, None)


def _free_in_us(counts: Mapping[int, int], need: int, window: _Window, now_us: int) -> int:
    """Time until the oldest sub-buckets holding ``need`` units leave the span."""
    freed = 0
    for bucket in sorted(counts):
        freed += counts[bucket]
        if freed >= need:
            return window.leaves_at_us(bucket) - now_us
    return window.leaves_at_us(window.current(now_us)) - now_us


def _empty_in_us(counts: Mapping[int, int], window: _Window, now_us: int) -> int:
    live = [bucket for bucket, n in counts.items() if n > 0]
    return window.leaves_at_us(max(live)) - now_us if live else 0


class LocalRateLimiter(RateLimiter):
    """The rate limiter of one process (the embedded mesh, tests)."""

    def __init__(
        self, *, window_s: float = 60.0, buckets: int = 60, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(window_s=window_s, buckets=buckets)
        self._clock = clock
        self._keys: dict[str, _KeyCounts] = {}
        self._next_sweep_us = 0

    def _now_us(self) -> int:
        return round(self._clock() * _US)

    async def _reserve(self, key_id: str, limits: RateLimits, tokens: int) -> _Outcome:
        now_us = self._now_us()
        self._sweep(now_us)
        counts = self._keys.setdefault(key_id, _KeyCounts())
        return counts.decide(self._window, now_us, limits, tokens)

    async def _settle(self, key_id: str, bucket: int, delta: int) -> None:
        counts = self._keys.get(key_id)
        if counts is not None and not self._window.expired(bucket, self._now_us()):
            counts.adjust_tokens(bucket, delta)

    def _sweep(self, now_us: int) -> None:
        """Forget idle keys, once per window, so memory follows active keys."""
        if now_us < self._next_sweep_us:
            return
        self._next_sweep_us = now_us + self._window.buckets * self._window.bucket_us
        oldest = self._window.current(now_us) - self._window.buckets
        for key_id in list(self._keys):
            counts = self._keys[key_id]
            counts.prune(oldest)
            if not counts.requests and not counts.tokens:
                del self._keys[key_id]

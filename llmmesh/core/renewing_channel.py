"""A secure channel that dials with the plane's current certificate.

A plane's channels live as long as the plane: the region's to the global
plane and to its pods, the edge's to the regions. gRPC reads a channel's
certificate once, when the channel is made, and presents it on every
connection it opens later, so a long-lived channel would go on presenting
a rotated-out certificate, and once that expired, fail to reconnect.
:class:`RenewingChannel` checks the plane's certificate files (at most once
a second, when a call starts) and, when they changed, makes a new channel
with the new certificate for every call from then on. The channel it
replaces keeps serving the calls already on it (a streaming turn, a
GenerateSession stream) for :data:`RETIRE_GRACE_S`, then is closed; its
certificate stays valid that long, as rotation issues the new one well
before the old expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

from llmmesh.core.tasks import cancel_and_wait

log = logging.getLogger(__name__)

RETIRE_GRACE_S = 3600.0
"""How long a replaced channel serves the calls already on it."""
CHECK_EVERY_S = 1.0
"""The least time between two checks of the certificate files."""


class _RenewingMultiCallable:
    """A method of a :class:`RenewingChannel`: each call goes out on the
    channel current when it starts."""

    def __init__(self, owner: RenewingChannel, kind: str, method: str, kwargs: dict[str, Any]) -> None:
        self._owner = owner
        self._kind = kind
        self._method = method
        self._kwargs = kwargs
        self._bound: tuple[grpc.aio.Channel, Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        channel = self._owner.current()
        if self._bound is None or self._bound[0] is not channel:
            self._bound = (channel, getattr(channel, self._kind)(self._method, **self._kwargs))
        return self._bound[1](*args, **kwargs)


class RenewingChannel(grpc.aio.Channel):  # type: ignore[misc]
    """A ``grpc.aio.Channel`` for stubs: ``open_channel`` makes a channel
    with the plane's current certificate; ``stamp`` tells what its files
    look like now, and a new channel is made when that changes (see the
    module docstring)."""

    def __init__(
        self,
        open_channel: Callable[[], grpc.aio.Channel],
        stamp: Callable[[], object],
        *,
        check_every_s: float = CHECK_EVERY_S,
        retire_grace_s: float = RETIRE_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open = open_channel
        self._stamp_of = stamp
        self._check_every_s = check_every_s
        self._retire_grace_s = retire_grace_s
        self._clock = clock
        self._stamp = stamp()
        self._channel = open_channel()
        self._checked_at = clock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._retired: list[grpc.aio.Channel] = []
        self.renewals = 0

    def current(self) -> grpc.aio.Channel:
        """The channel a call starting now goes out on."""
        now = self._clock()
        if now - self._checked_at >= self._check_every_s:
            self._checked_at = now
            stamp = self._stamp_of()
            if stamp != self._stamp:
                self._stamp = stamp
                self._retire(self._channel)
                self._channel = self._open()
                self.renewals += 1
                log.info("mesh certificate changed: new calls go out on a channel that presents it")
        return self._channel

    def _retire(self, channel: grpc.aio.Channel) -> None:
        self._retired.append(channel)
        try:
            task = asyncio.get_running_loop().create_task(self._close_later(channel))
        except RuntimeError:  # no loop: closed with the channel itself
            return
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _close_later(self, channel: grpc.aio.Channel) -> None:
        await channel.close(grace=self._retire_grace_s)
        with contextlib.suppress(ValueError):
            self._retired.remove(channel)

    def unary_unary(self, method: str, **kwargs: Any) -> Any:
        return _RenewingMultiCallable(self, "unary_unary", method, kwargs)

    def unary_stream(self, method: str, **kwargs: Any) -> Any:
        return _RenewingMultiCallable(self, "unary_stream", method, kwargs)

    def stream_unary(self, method: str, **kwargs: Any) -> Any:
        return _RenewingMultiCallable(self, "stream_unary", method, kwargs)

    def stream_stream(self, method: str, **kwargs: Any) -> Any:
        return _RenewingMultiCallable(self, "stream_stream", method, kwargs)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.current().get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self.current().wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self.current().channel_ready()

    async def close(self, grace: float | None = None) -> None:
        """Close the current channel and every replaced one, as
        ``grpc.aio.Channel.close`` does."""
        for task in list(self._retiring):
            await cancel_and_wait(task)
        channels = [self._channel, *self._retired]
        self._retired = []
        await asyncio.gather(*(channel.close(grace) for channel in channels))

    async def __aenter__(self) -> RenewingChannel:
        return self

    async def __aexit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        await self.close()

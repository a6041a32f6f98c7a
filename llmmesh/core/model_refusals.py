"""The registry's refusals of a model name, remembered like its answers.

:class:`~llmmesh.model_resolver.ModelResolver` remembers what a name
resolves to; without this, a name the registry refuses (unknown, retired,
not for the tier) was asked about again on every request that named it. A
region's ``auto`` turns resolve every model its pods serve, so one pod still
serving a retired or unregistered model put a ``ResolveModel`` round trip on
every turn's path; a client repeating a wrong name did the same at the edge.
A refusal is kept for the resolver's TTL: within it, the refusal is raised
again at once; past half of it, it is still raised and the name is asked
about in the background (:mod:`llmmesh.core.refresh`), so a model registered,
restored or opened to the tier is served from the first request after that
refresh, and at the latest once the TTL has run out.

Background refreshes run outside the request's context
(:func:`detached`), so a trace shows a turn's own calls only, not the
refresh a turn happened to start.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Hashable
from typing import TypeVar

import grpc.aio

from llmmesh.core.errors import MeshError, from_rpc_error

T = TypeVar("T")


class RefusalCache:
    """Refusals by key (a name and a tier), each with when it was heard."""

    def __init__(self, capacity: int = 4096) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._capacity = capacity
        self._refusals: dict[Hashable, tuple[float, grpc.aio.AioRpcError]] = {}

    def remember(self, key: Hashable, at: float, err: grpc.aio.AioRpcError) -> None:
        """Keep ``err`` (the registry's failed call) as the answer for ``key``
        heard at ``at``; the oldest refusal goes past ``capacity``, so names
        a client makes up cannot grow it without bound."""
        self._refusals.pop(key, None)
        self._refusals[key] = (at, err)
        while len(self._refusals) > self._capacity:
            del self._refusals[next(iter(self._refusals))]

    def forget(self, key: Hashable) -> None:
        """Drop the refusal of ``key`` (the registry now resolves it)."""
        self._refusals.pop(key, None)

    def clear(self) -> None:
        """Drop every refusal (what the registry says may have changed)."""
        self._refusals.clear()

    def age_of(self, key: Hashable, now: float) -> float | None:
        """How long ago ``key`` was refused; None when it was not."""
        found = self._refusals.get(key)
        return None if found is None else now - found[0]

    def error(self, key: Hashable) -> MeshError:
        """A new MeshError for the refusal of ``key`` (a fresh one each time,
        so raising it again never grows one exception's traceback)."""
        return from_rpc_error(self._refusals[key][1])

    def __len__(self) -> int:
        return len(self._refusals)


def detached(start: Callable[[], asyncio.Task[T]]) -> asyncio.Task[T]:
    """``start()`` (which creates a task) in an empty context: the task it
    makes inherits no trace span, request id or other context of the
    request that happened to start it."""
    return contextvars.Context().run(start)

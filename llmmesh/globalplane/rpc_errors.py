"""Turning domain errors into rich gRPC statuses, once, for every servicer."""

from __future__ import annotations

from types import TracebackType
from typing import Any, TypeAlias

import grpc.aio

from llmmesh.core.errors import MeshError

ServicerContext: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class abort_on_mesh_error:  # noqa: N801 - used like a function: ``async with abort_on_mesh_error(ctx)``
    """Ends the RPC with the status of any :class:`MeshError` raised inside.

    Other exceptions pass through (gRPC reports them as UNKNOWN and logs
    them), so bugs are not dressed up as domain errors.
    """

    def __init__(self, context: ServicerContext) -> None:
        self._context = context

    async def __aenter__(self) -> None:
        return None

    # Returning None (never True) tells type checkers no exception is
    # swallowed: MeshError.abort always raises.
    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(err, MeshError):
            await err.abort(self._context)

"""Who calls one of the region's services: the servicer context's type and
the API key the call carries. Every servicer of the region reads its caller
here."""

from __future__ import annotations

from typing import TypeAlias

import grpc.aio

from llmmesh.core import apikeys

# grpc ships no type stubs; the alias names what the value is.
Context: TypeAlias = grpc.aio.ServicerContext


def caller_secret(context: Context) -> str | None:
    """The API key from ``authorization: Bearer`` metadata."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            return apikeys.bearer_secret(value)
    return None

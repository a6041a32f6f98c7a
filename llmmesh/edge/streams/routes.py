"""``GET /v1/streams/{stream_id}`` (resume) and ``POST
/v1/streams/{stream_id}/cancel``.

A stream's id is its completion id. Only the API key that started a stream
may resume or cancel it; for any other key the stream does not exist (404,
``stream_not_found``), as it does not for an unknown or expired id. While
the stream log cannot be reached, both answer 503 (``stream_log_unavailable``).
Both look in the log of the caller's zone alone (:mod:`edge.streams.zones`):
a stream lives in its tenant's zone, and only its tenant's key may see it.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llmmesh.edge.caller import authenticate
from llmmesh.edge.mesh_client import MeshClient, Principal
from llmmesh.edge.streams.framing import wants_event_ids
from llmmesh.edge.streams.hub import StreamHub, log_unavailable, not_found, parse_position
from llmmesh.edge.streams.log import StreamInfo, StreamLogError


class StreamRoutes:
    """Resume and cancel, on any edge sharing the stream log."""

    def __init__(self, mesh: MeshClient, streams: StreamHub) -> None:
        self._mesh = mesh
        self._streams = streams

    async def _owned(self, principal: Principal, stream_id: str) -> StreamInfo:
        try:
            async with asyncio.timeout(self._streams.log_timeout_s):
                info = await self._streams.logs.of(principal.tenant.zone).info(stream_id)
        except (StreamLogError, TimeoutError) as err:
            raise log_unavailable() from err
        if info is None or info.key_id != principal.key_id:
            raise not_found(stream_id)
        return info

    async def resume(self, request: Request) -> Response:
        """Replay the events after ``?starting_after=N`` (or the
        ``Last-Event-ID`` header; neither: all), then follow live to the end.
        Events are numbered from 0 whether or not they were sent with ids,
        so a client that counted N events resumes with ``starting_after=N-1``;
        the resumed events have ``id:`` lines when the client asks
        (:func:`wants_event_ids`)."""
        principal = await authenticate(request, self._mesh)
        if "starting_after" in request.query_params:
            after = parse_position(request.query_params["starting_after"], "starting_after")
        else:
            after = parse_position(request.headers.get("last-event-id"), "Last-Event-ID")
        stream_id = request.path_params["stream_id"]
        info = await self._owned(principal, stream_id)
        headers = {"x-request-id": stream_id, "x-llmmesh-region": info.region}
        return self._streams.response(
            stream_id, after, headers, zone=principal.tenant.zone, event_ids=wants_event_ids(request)
        )

    async def cancel(self, request: Request) -> Response:
        """Stop the stream's generation; answers once the stream has ended
        (or the cancel grace has passed)."""
        principal = await authenticate(request, self._mesh)
        stream_id = request.path_params["stream_id"]
        await self._owned(principal, stream_id)
        try:
            cancelled = await self._streams.cancel(stream_id, principal.tenant.zone)
        except StreamLogError as err:
            raise log_unavailable() from err
        return JSONResponse(
            {
                "id": stream_id,
                "object": "stream.cancel",
                "status": "cancelled" if cancelled else "already_finished",
            },
            headers={"x-request-id": stream_id},
        )

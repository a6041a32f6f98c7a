"""How a client's SSE events are framed: OpenAI's way by default, or with
event ids for a client that resumes by them.

By default every event is one ``data: {...}`` line and the stream ends with
``data: [DONE]``, byte-compatible with OpenAI, so that parsers that strip
only a leading ``data: `` (vLLM's ``bench serve``, many SDK ports) read it.
A client opts into an ``id: N`` line before each event with
``x-llmmesh-event-ids: true``, or ``x-llmmesh-resumable: true`` (which also
detaches the stream from its connection, :mod:`edge.streams.hub`), or, on a
resume, by sending ``Last-Event-ID`` as an SSE client does. Either way a
stream's events are numbered 0, 1, 2, ..., so a client that kept no ids
resumes after N events with ``GET /v1/streams/{id}?starting_after=N-1``.
"""

from __future__ import annotations

from starlette.requests import Request

RESUMABLE_HEADER = "x-llmmesh-resumable"
RESUMABLE_REASON_HEADER = "x-llmmesh-resumable-reason"
NOT_RESUMABLE = {RESUMABLE_HEADER: "false", RESUMABLE_REASON_HEADER: "stream_log_unavailable"}
"""The response headers of a stream that runs unlogged: it cannot be resumed
(nor detached, nor cancelled by id), since the shared stream log was
unreachable when it began."""
EVENT_IDS_HEADER = "x-llmmesh-event-ids"
_TRUE = ("true", "1")


def header_set(request: Request, name: str) -> bool:
    """Whether the request sets the boolean header ``name`` (``true`` or ``1``)."""
    return request.headers.get(name, "").strip().lower() in _TRUE


def wants_event_ids(request: Request) -> bool:
    """Whether the client opted into ``id:`` lines (see the module docstring)."""
    return (
        header_set(request, EVENT_IDS_HEADER)
        or header_set(request, RESUMABLE_HEADER)
        or "last-event-id" in request.headers
    )

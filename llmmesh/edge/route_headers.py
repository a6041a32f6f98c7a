"""The ``x-llmmesh-route-*`` response headers: which model the region chose
for a turn and why (``ChatStarted.route``), on streamed and whole answers."""

from __future__ import annotations

from llmmesh.v1 import chat_service_pb2

AUTO_MODELS = ("", "auto")
"""Model names that leave the choice to the region."""
ROUTE_REASON_HEADER = "x-llmmesh-route-reason"
ROUTE_MODEL_HEADER = "x-llmmesh-route-model"
ROUTE_DETAIL_HEADER = "x-llmmesh-route-detail"


def route_headers(started: chat_service_pb2.ChatStarted) -> dict[str, str]:
    """The reason (``requested``, ``default``, ``difficulty``, ``budget``,
    ``fallback``), the model serving the turn and the region's explanation;
    none for a region that reported no decision."""
    if not started.route.reason:
        return {}
    # Header values are latin-1 on the wire; the detail is the region's own ASCII text.
    detail = started.route.detail.encode("ascii", "replace").decode("ascii")
    return {
        ROUTE_REASON_HEADER: started.route.reason,
        ROUTE_MODEL_HEADER: started.model,
        ROUTE_DETAIL_HEADER: detail,
    }

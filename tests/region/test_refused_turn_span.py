"""A ``Chat`` call refused before its first event (a bad key, an unknown
model) closes its turn span cleanly: no "Failed to detach context" error
from OpenTelemetry, and the span is exported."""

from __future__ import annotations

import gc
import logging

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.region.test_chat_servicer import start, turn_error
from tests.stack import Stack, running_stack

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize(
    ("key", "model", "code"),
    [
        ("sk-not-a-key", "auto", grpc.StatusCode.UNAUTHENTICATED),
        (None, "no-such-model", grpc.StatusCode.NOT_FOUND),
    ],
)
async def test_a_refused_chat_call_detaches_its_span_context(
    spans: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
    key: str | None,
    model: str,
    code: grpc.StatusCode,
) -> None:
    request = start()
    request.start.model = model
    request.start.request_id = f"refused-{code.name.lower()}"
    stack: Stack
    with caplog.at_level(logging.ERROR):
        async with running_stack() as stack:
            error = await (turn_error(stack, request, key) if key else turn_error(stack, request))
        # A turn generator left open is finalized here, where it would log the error.
        gc.collect()
    assert error.code == code
    detach = [r for r in caplog.records if "detach context" in r.getMessage()]
    assert not detach, [r.getMessage() for r in detach]
    names = [s.attributes.get("llmmesh.request_id") for s in spans.get_finished_spans() if s.attributes]
    assert request.start.request_id in names

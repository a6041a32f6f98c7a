"""A gRPC client's ``Chat`` turn in the region's traces: the turn's span
continues the ``traceparent`` the call's metadata carries (or starts a
trace of its own), carries the GenAI attributes, and is the parent of its
pod's generation span; an in-process mesh with an in-memory exporter."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from llmmesh.core.grpcserver import open_channel
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc
from tests.region.test_chat_servicer import auth, start
from tests.stack import Stack, running_stack, wait_until

pytestmark = pytest.mark.asyncio

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest_asyncio.fixture
async def traced_stack(spans: InMemorySpanExporter) -> AsyncIterator[Stack]:
    async with running_stack() as running:
        yield running


async def chat(
    stack: Stack, request_id: str, *metadata: tuple[str, str]
) -> list[chat_service_pb2.ChatResponse]:
    request = start(max_tokens=6)
    request.start.request_id = request_id
    async with open_channel(stack.region.address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=(*auth(), *metadata))
        await call.write(request)
        await call.done_writing()
        return [event async for event in call]


def turn_spans(spans: InMemorySpanExporter, request_id: str) -> tuple[ReadableSpan, ReadableSpan]:
    found = spans.get_finished_spans()
    [turn] = [s for s in found if s.attributes and s.attributes.get("llmmesh.request_id") == request_id]
    assert turn.context is not None
    turn_id = turn.context.span_id
    [pod] = [s for s in found if s.name.startswith("generate") and s.parent and s.parent.span_id == turn_id]
    return turn, pod


async def test_a_chat_turn_continues_its_callers_trace(
    traced_stack: Stack, spans: InMemorySpanExporter
) -> None:
    traceparent = ("traceparent", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
    events = await chat(traced_stack, "turn-traced", traceparent)
    usage = next(e.usage.usage for e in events if e.HasField("usage"))
    finished = next(e.finished for e in events if e.HasField("finished"))

    def ended() -> bool:
        names = [s.name for s in spans.get_finished_spans()]
        return any(n.startswith("generate") for n in names) and any(n.startswith("chat") for n in names)

    await wait_until(ended, 5.0, "the turn's and the pod's spans ended")
    turn, pod = turn_spans(spans, "turn-traced")
    assert turn.kind is SpanKind.SERVER and turn.parent is not None
    assert f"{turn.parent.trace_id:032x}" == CLIENT_TRACE and f"{turn.parent.span_id:016x}" == CLIENT_SPAN
    assert turn.attributes is not None and pod.attributes is not None
    assert turn.attributes["gen_ai.operation.name"] == "chat"
    assert turn.attributes["gen_ai.request.model"] == "auto"
    assert turn.attributes["gen_ai.usage.input_tokens"] == usage.input_tokens
    assert turn.attributes["gen_ai.usage.output_tokens"] == usage.output_tokens == 6
    assert turn.attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert finished.reason
    assert pod.attributes["llmmesh.plane"] == "engine"
    assert pod.attributes["gen_ai.usage.output_tokens"] == 6


async def test_a_chat_turn_without_a_caller_trace_starts_its_own(
    traced_stack: Stack, spans: InMemorySpanExporter
) -> None:
    await chat(traced_stack, "turn-untraced")
    await wait_until(
        lambda: any(s.name.startswith("generate") for s in spans.get_finished_spans()), 5.0, "spans ended"
    )
    turn, pod = turn_spans(spans, "turn-untraced")
    assert turn.parent is None
    assert turn.context is not None and pod.context is not None
    assert pod.context.trace_id == turn.context.trace_id

"""What a region calls on a turn's path, read from its traces: after the
first turn the region has what it needs (the model registry's answers,
refusals included, and the pods' tokenizer), so later turns call neither
``ResolveModel`` nor ``GetTokenizer``; an in-process mesh with an
in-memory exporter."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from llmmesh.grpcserver import open_channel
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc
from tests.region.test_chat_servicer import auth, start
from tests.stack import Stack, running_stack

pytestmark = pytest.mark.asyncio

LOOKUPS = ("ModelRegistryService/ResolveModel", "EngineService/GetTokenizer")


async def turn(stack: Stack, request_id: str, model: str = "auto") -> list[chat_service_pb2.ChatResponse]:
    request = start(max_tokens=4)
    request.start.request_id = request_id
    request.start.model = model
    async with open_channel(stack.region.address) as channel:
        call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(metadata=auth())
        await call.write(request)
        await call.done_writing()
        return [event async for event in call]


def lookups(spans: InMemorySpanExporter) -> list[str]:
    return [s.name for s in spans.get_finished_spans() if s.name.endswith(LOOKUPS)]


async def test_only_the_first_turn_looks_up_models_and_tokenizers(spans: InMemorySpanExporter) -> None:
    async with running_stack() as stack:
        events = await turn(stack, "first")
        assert any(e.HasField("finished") for e in events)
        assert lookups(spans), "the first turn resolves its model and learns the tokenizer"
        spans.clear()
        for n in range(3):
            events = await turn(stack, f"later-{n}")
            assert any(e.HasField("finished") for e in events)
        assert lookups(spans) == []


async def test_a_refused_model_name_is_asked_about_once(spans: InMemorySpanExporter) -> None:
    async with running_stack() as stack:
        for n in range(3):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await turn(stack, f"unknown-{n}", model="no-such-model")
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        asked = [
            s for s in spans.get_finished_spans() if s.kind is SpanKind.CLIENT and s.name.endswith(LOOKUPS)
        ]
        assert [s.name for s in asked] == ["llmmesh.v1.ModelRegistryService/ResolveModel"]

"""What a region calls on a turn's path, read from its traces: once the
region has warmed its model lookups (:mod:`region.modelchoice.lookup_warmer`), no turn,
the first included, calls ``ResolveModel``; only the first learns the pods'
tokenizer (``GetTokenizer``), and no later turn calls either; a name the
registry refuses is asked about once; an in-process mesh with an in-memory
exporter."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from llmmesh.core.grpcserver import open_channel
from llmmesh.v1 import chat_service_pb2, chat_service_pb2_grpc
from tests.region.test_chat_servicer import auth, start
from tests.stack import Stack, running_stack, wait_until

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


async def test_no_turn_resolves_models_once_the_region_is_warm(
    spans: InMemorySpanExporter,
) -> None:
    async with running_stack() as stack:
        lookups_warmer = stack.region.lookups
        assert lookups_warmer is not None

        def warm() -> bool:
            names, tiers = lookups_warmer.warmed
            return "llmmesh-tiny" in names and bool(tiers)

        await wait_until(warm, 10.0, "the region's lookups warmed for its model and tenants")
        # The warmer's calls belong to no turn (untraced); a turn's own are
        # traced, as the refused name's below shows.
        spans.clear()
        events = await turn(stack, "first")
        assert any(e.HasField("finished") for e in events)
        assert {name.rsplit("/", 1)[-1] for name in lookups(spans)} <= {"GetTokenizer"}
        spans.clear()
        for n in range(3):
            events = await turn(stack, f"turn-{n}")
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

"""One streamed turn that fails over mid-stream is one trace: the client's
``traceparent`` at the edge, the edge's span per serving region (the
failover's linked to the first), each region's turn span under the edge's
span for it, each pod's generation under its region's, the zone-store
write, and the usage shipment to billing (a trace of its own, linked to
the turns it bills), on an in-process multi-region mesh with an in-memory
span exporter."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from llmmesh.core.json_logs import JsonFormatter
from tests.edge.test_failover import mesh_of, regions, settle_billing, stream
from tests.stack import wait_until

pytestmark = pytest.mark.asyncio

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def of_plane(found: Sequence[ReadableSpan], plane: str, prefix: str) -> list[ReadableSpan]:
    return [
        s
        for s in found
        if s.attributes and s.attributes.get("llmmesh.plane") == plane and s.name.startswith(prefix)
    ]


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    assert span.parent is not None and parent.context is not None
    return bool(span.parent.span_id == parent.context.span_id)


def attribute(span: ReadableSpan, name: str) -> object:
    assert span.attributes is not None
    return span.attributes.get(name)


def number(span: ReadableSpan, name: str) -> int:
    value = attribute(span, name)
    assert isinstance(value, int), (name, value)
    return value


def hex_id(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


async def test_a_failed_over_turn_is_one_trace_across_edge_regions_and_pods(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(JsonFormatter("edge"))
    failover_log = logging.getLogger("llmmesh.edge.failover")
    failover_log.addHandler(handler)
    async with mesh_of(tmp_path, regions()) as mesh:
        tenant_id, secret = await mesh.new_key("us")
        headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
        try:
            async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as http:
                got = await stream(http, secret, after_content=mesh.kill, headers=headers)
        finally:
            failover_log.removeHandler(handler)
        got.assert_one_whole_stream()
        await settle_billing(mesh, "us")

        def finished() -> list[ReadableSpan]:
            return list(spans.get_finished_spans())

        await wait_until(
            lambda: (
                len(of_plane(finished(), "engine", "generate")) == 2
                and len(of_plane(finished(), "region", "chat")) == 2
                and len(of_plane(finished(), "edge", "chat")) == 2
            ),
            10.0,
            "both regions' turn and generation spans ended",
        )
        found = finished()

    # The edge's failover log lines name the turn and its trace.
    logged = [json.loads(line) for line in lines.getvalue().splitlines()]
    assert any("failed over from region" in entry["message"] for entry in logged), logged
    for entry in logged:
        assert entry["request_id"] == got.chunks[0]["id"]
        assert entry["trace_id"] == CLIENT_TRACE
        assert entry["plane"] == "edge" and entry["level"] == "WARNING"

    in_trace = [s for s in found if hex_id(s)[0] == CLIENT_TRACE]
    # The edge continues the client's trace.
    [request] = [s for s in in_trace if s.name == "POST /v1/chat/completions"]
    assert request.kind is SpanKind.SERVER and request.parent is not None
    assert f"{request.parent.span_id:016x}" == CLIENT_SPAN
    assert request.attributes is not None and request.attributes["http.response.status_code"] == 200

    # One edge span per serving region, both children of the request; the second linked to the first.
    first, second = sorted(of_plane(in_trace, "edge", "chat"), key=lambda s: number(s, "llmmesh.attempt"))
    assert child_of(first, request) and child_of(second, request)
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["llmmesh.region"] == got.region
    assert not first.status.is_ok
    assert second.attributes["llmmesh.failover_from_region"] == got.region
    [link] = second.links
    assert first.context is not None and link.context.span_id == first.context.span_id
    assert link.context.trace_id == first.context.trace_id
    # The whole turn's GenAI attributes on the span that finished it.
    usage = got.usage
    assert second.attributes["gen_ai.operation.name"] == "chat"
    assert second.attributes["gen_ai.system"] == "llmmesh"
    # The client asked for "auto": the edge or the region chose the model that answered.
    served_model = second.attributes["gen_ai.response.model"]
    assert isinstance(served_model, str) and served_model.startswith("llmmesh-")
    assert second.attributes["gen_ai.request.model"] in ("auto", served_model)
    assert second.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert second.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert second.attributes["gen_ai.response.finish_reasons"] == (
        got.chunks[-2]["choices"][0]["finish_reason"],
    )

    # Each region's turn span is a child of the edge's span for it, in two regions of the zone.
    region_turns = of_plane(in_trace, "region", "chat")
    by_parent = {s.parent.span_id: s for s in region_turns if s.parent is not None}
    assert first.context is not None and second.context is not None
    lost, continued = by_parent[first.context.span_id], by_parent[second.context.span_id]
    assert lost.kind is SpanKind.SERVER and continued.kind is SpanKind.SERVER
    assert lost.attributes is not None and continued.attributes is not None
    assert lost.attributes["llmmesh.region"] == got.region
    assert continued.attributes["llmmesh.region"] not in ("", got.region)
    assert continued.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert continued.attributes["gen_ai.response.model"] == served_model

    # Each region's pod generation is a child of its turn span.
    pods = of_plane(in_trace, "engine", "generate")
    assert any(child_of(p, lost) for p in pods) and any(child_of(p, continued) for p in pods)
    pod_of_continued = next(p for p in pods if child_of(p, continued))
    assert pod_of_continued.attributes is not None
    assert number(pod_of_continued, "gen_ai.usage.output_tokens") > 0

    # The continuing region writes the turn to the zone store inside the trace.
    writes = [s for s in in_trace if s.name == "zone store write"]
    assert any(child_of(w, continued) for w in writes)

    # Billing: a shipment is a trace of its own linked to the turns it bills,
    # and billing's server span is in the shipment's trace.
    ships = [
        s
        for s in found
        if s.name == "usage ship" and any(link.context.trace_id == int(CLIENT_TRACE, 16) for link in s.links)
    ]
    assert ships, "no usage shipment linked to the turn"
    ship_traces = {s.context.trace_id for s in ships if s.context is not None}
    billing = [
        s for s in found if s.name == "llmmesh.v1.BillingService/RecordUsage" and s.kind is SpanKind.SERVER
    ]
    assert any(s.context is not None and s.context.trace_id in ship_traces for s in billing)
    assert tenant_id


async def test_an_unsampled_turn_records_no_span_in_any_plane(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """A client's ``traceparent`` with the sampled flag off is followed by
    every plane: the turn streams whole and no plane records a span of its
    trace (what ``llmmesh bench overhead``'s unsampled turns rely on), while
    a sampled turn beside it is recorded in all three."""
    unsampled_trace, sampled_trace = "5" * 32, "6" * 32
    async with mesh_of(tmp_path, regions()) as mesh:
        _, secret = await mesh.new_key("us")
        async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as http:
            quiet = await stream(
                http, secret, headers={"traceparent": f"00-{unsampled_trace}-{CLIENT_SPAN}-00"}
            )
            loud = await stream(http, secret, headers={"traceparent": f"00-{sampled_trace}-{CLIENT_SPAN}-01"})
        quiet.assert_one_whole_stream()
        loud.assert_one_whole_stream()

        def planes_of(trace: str) -> set[object]:
            return {
                attribute(s, "llmmesh.plane")
                for s in spans.get_finished_spans()
                if hex_id(s)[0] == trace and s.name.startswith(("chat", "generate"))
            }

        await wait_until(
            lambda: planes_of(sampled_trace) == {"edge", "region", "engine"},
            10.0,
            "the sampled turn's spans ended in every plane",
        )
        assert not [s for s in spans.get_finished_spans() if hex_id(s)[0] == unsampled_trace]

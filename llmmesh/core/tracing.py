"""OpenTelemetry traces of a turn across the mesh: edge -> region -> pod,
the zone store's write, and billing.

Off unless configured. A process traces when it is given an OTLP collector
(``--otlp-endpoint``/``LLMMESH_OTLP_ENDPOINT``, or OpenTelemetry's own
``OTEL_EXPORTER_OTLP_ENDPOINT``), or when a test installs a provider
(:func:`install`). Off by default because with no collector every span
would be made only to be dropped; and when off, no interceptor is
installed and no span recorded, so tracing costs an untraced mesh next to
nothing.
When on, new traces are sampled at ``trace_sample_ratio`` at the edge (or
whichever plane starts the trace) and every other plane follows the
sampled flag of the W3C ``traceparent`` it is handed (parent-based), so a
trace is kept whole or not at all.

Context crosses planes as W3C trace context: in gRPC call metadata
(:mod:`llmmesh.core.grpc_tracing`) for ordinary calls, and in a
``TraceContext`` message for each request of a session stream, which
carries many requests on one call. This module is the only one that talks
to the OpenTelemetry SDK; planes use :func:`span`, :func:`start_span` and
the propagation helpers.

A span's resource names the process that made it: ``service.name``
(``llmmesh-edge``, ``llmmesh-region``...) and, for a zone-bound plane (a
region, a pod), ``llmmesh.zone`` and ``llmmesh.region``, which it takes
from OpenTelemetry's ``OTEL_RESOURCE_ATTRIBUTES`` (:func:`placement_env`).
The edge and the global plane are in no zone and name none. Spans outside
a zone never carry a turn's content (prompt, reply) or its raw end-user
id: only ids, models, token counts and statuses.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from llmmesh.core.config import setting
from llmmesh.v1 import common_pb2

log = logging.getLogger(__name__)

INSTRUMENTATION = "llmmesh"
_PROPAGATOR = TraceContextTextMapPropagator()
_NO_TRACER = trace.NoOpTracer()


@dataclass(frozen=True)
class TracingSettings:
    """The settings every plane has for its traces."""

    otlp_endpoint: str = setting(
        "",
        "OTLP/gRPC trace collector (http://host:4317); empty: OTEL_EXPORTER_OTLP_ENDPOINT, else none",
    )
    trace_sample_ratio: float = setting(
        1.0, "share of new traces kept (0 to 1); a request's sampled traceparent is always followed"
    )


class _State:
    provider: TracerProvider | None = None
    tracer: trace.Tracer = _NO_TRACER
    # Spans of recent requests by request id, for later work done for them
    # in a trace of its own (a usage shipment links the turns it bills).
    recent: ClassVar[OrderedDict[str, trace.SpanContext]] = OrderedDict()


ZONE_ATTRIBUTE = "llmmesh.zone"
"""Resource attribute: the zone of the plane that made the span (zone-bound planes only)."""

REGION_ATTRIBUTE = "llmmesh.region"
"""Resource attribute: the region of the plane that made the span (zone-bound planes only)."""

_RESOURCE_ENV = "OTEL_RESOURCE_ATTRIBUTES"


def placement_env(zone: str, region: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment that puts ``zone`` and ``region`` on the resource of
    a zone-bound plane's spans, after any resource attributes ``environ``
    already sets (OpenTelemetry's later pairs win)."""
    own = f"{ZONE_ATTRIBUTE}={zone},{REGION_ATTRIBUTE}={region}"
    inherited = environ.get(_RESOURCE_ENV, "")
    return {_RESOURCE_ENV: f"{inherited},{own}" if inherited else own}


RECENT_SPANS = 4096
"""How many requests' spans :func:`remember` keeps for :func:`links_to_requests`."""


def install(provider: TracerProvider) -> None:
    """Trace this process's spans with ``provider`` (tests install one
    with an in-memory exporter)."""
    _State.provider = provider
    _State.tracer = provider.get_tracer(INSTRUMENTATION)


def uninstall() -> None:
    """Stop tracing; the provider is flushed and shut down."""
    provider, _State.provider, _State.tracer = _State.provider, None, _NO_TRACER
    _State.recent.clear()
    if provider is not None:
        provider.shutdown()


def enabled() -> bool:
    """Whether this process traces."""
    return _State.provider is not None


def tracer() -> trace.Tracer:
    """The tracer for the mesh's spans (a no-op one when tracing is off)."""
    return _State.tracer


def configure_tracing(service: str, settings: TracingSettings) -> bool:
    """Export this process's spans over OTLP when a collector is
    configured; return whether it traces. ``service`` is the resource's
    ``service.name`` (``llmmesh-edge``, ``llmmesh-region``...), beside
    whatever ``OTEL_RESOURCE_ATTRIBUTES`` sets (a zone-bound plane's zone
    and region, :func:`placement_env`)."""
    endpoint = settings.otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    if not endpoint:
        return False
    if not 0.0 <= settings.trace_sample_ratio <= 1.0:
        raise ValueError(f"trace_sample_ratio must be within 0 and 1, not {settings.trace_sample_ratio}")
    # Imported only when used: the exporter pulls in its own gRPC stack.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": service}),
        sampler=ParentBased(TraceIdRatioBased(settings.trace_sample_ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    install(provider)
    log.info("tracing to %s (sample ratio %g)", endpoint, settings.trace_sample_ratio)
    return True


def inject_headers(carrier: dict[str, str], ctx: otel_context.Context | None = None) -> None:
    """Add ``traceparent`` (and ``tracestate``) of ``ctx`` (default: the
    current context) to ``carrier`` when there is a span to continue."""
    _PROPAGATOR.inject(carrier, context=ctx)


def extract_headers(carrier: Mapping[str, str]) -> otel_context.Context | None:
    """The remote span context ``carrier`` names; None when it names none."""
    if "traceparent" not in carrier:
        return None
    ctx = _PROPAGATOR.extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def trace_context_message() -> common_pb2.TraceContext | None:
    """The current span as a ``TraceContext`` for a session request; None
    when tracing is off or no span is current."""
    if not enabled():
        return None
    carrier: dict[str, str] = {}
    inject_headers(carrier)
    if "traceparent" not in carrier:
        return None
    return common_pb2.TraceContext(
        traceparent=carrier["traceparent"], tracestate=carrier.get("tracestate", "")
    )


def context_of_message(message: common_pb2.TraceContext) -> otel_context.Context:
    """The remote parent a session request's ``TraceContext`` names; when
    it names none, an empty context, so the request starts a trace of its
    own rather than joining whatever span the session's task has current."""
    if not message.traceparent:
        return otel_context.Context()
    carrier = {"traceparent": message.traceparent}
    if message.tracestate:
        carrier["tracestate"] = message.tracestate
    return extract_headers(carrier) or otel_context.Context()


def current_trace_id() -> str:
    """The current trace's id as 32 hex digits; empty outside a trace."""
    context = trace.get_current_span().get_span_context()
    return trace.format_trace_id(context.trace_id) if context.is_valid else ""


def start_span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    parent: otel_context.Context | None = None,
    links: Sequence[Link] = (),
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Span:
    """A span the caller ends (one that outlives a block, such as a stream's)."""
    return _State.tracer.start_span(name, context=parent, kind=kind, links=links, attributes=attributes)


@contextmanager
def span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    parent: otel_context.Context | None = None,
    links: Sequence[Link] = (),
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Iterator[Span]:
    """A span current for the block (and the tasks it starts), ended when
    the block ends; an exception marks it failed. ``parent`` continues a
    remote span. With tracing off it is the invalid span, made current
    nowhere."""
    if _State.provider is None:
        yield trace.INVALID_SPAN
        return
    with _State.tracer.start_as_current_span(
        name, context=parent, kind=kind, links=links, attributes=attributes
    ) as current:
        yield current


@contextmanager
def current(span_: Span) -> Iterator[None]:
    """Make ``span_`` current for the block without ending it (with
    tracing off, nothing)."""
    if _State.provider is None:
        yield
        return
    token = otel_context.attach(trace.set_span_in_context(span_))
    try:
        yield
    finally:
        otel_context.detach(token)


def link_to(span_: Span, **attributes: AttributeValue) -> Link:
    """A link to ``span_`` (a failover hop to the turn it continues)."""
    return Link(span_.get_span_context(), attributes or None)


def remember(request_id: str, span_: Span) -> None:
    """Keep ``span_`` as the span of ``request_id`` (the newest
    :data:`RECENT_SPANS`), so later work for it can link to it."""
    context = span_.get_span_context()
    if not context.is_valid:
        return
    _State.recent[request_id] = context
    _State.recent.move_to_end(request_id)
    while len(_State.recent) > RECENT_SPANS:
        _State.recent.popitem(last=False)


def links_to_requests(request_ids: Sequence[str]) -> list[Link]:
    """Links to the remembered spans of ``request_ids`` (those this process still knows)."""
    known = (_State.recent.get(request_id) for request_id in request_ids)
    return [Link(context) for context in known if context is not None]


def end_failed(span_: Span, error: BaseException | str) -> None:
    """End ``span_`` as failed with ``error``."""
    if isinstance(error, BaseException):
        span_.record_exception(error)
    span_.set_status(Status(StatusCode.ERROR, str(error)))
    span_.end()

"""OpenTelemetry's GenAI semantic conventions on a turn's spans: what was
asked (``gen_ai.request.model``), what answered (``gen_ai.response.model``),
the tokens metered (``gen_ai.usage.*``) and how it ended
(``gen_ai.response.finish_reasons``).

The edge's and the region's turn spans read them off the ``ChatResponse``
events the turn streams (:class:`ChatSpan`); the pod's from its generation.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from llmmesh.v1 import chat_service_pb2, common_pb2

SYSTEM = "llmmesh"
"""``gen_ai.system`` of the mesh's spans, the pods' included (their engine is the pod's own setting)."""


def chat_attributes(
    model: str, *, plane: str, system: str = SYSTEM, **extra: AttributeValue
) -> Mapping[str, AttributeValue]:
    """The attributes a chat span starts with; ``plane`` (edge, region,
    engine) is ``llmmesh.plane``, and ``extra`` become ``llmmesh.*``."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": system,
        "gen_ai.request.model": model,
        "llmmesh.plane": plane,
    }
    attributes.update({f"llmmesh.{key}": value for key, value in extra.items()})
    return attributes


def finish_reason(reason: common_pb2.FinishReason.ValueType) -> str:
    """OpenAI's name of a finish reason (``stop``, ``length``...)."""
    return common_pb2.FinishReason.Name(reason).removeprefix("FINISH_REASON_").lower()


def record_usage(span: Span, usage: common_pb2.TokenUsage) -> None:
    span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)


def record_finish(span: Span, reason: common_pb2.FinishReason.ValueType) -> None:
    span.set_attribute("gen_ai.response.finish_reasons", [finish_reason(reason)])


class ChatSpan:
    """Records a turn's ``ChatResponse`` events on ``span`` as they pass."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self._recording = span.is_recording()

    def observe(self, event: chat_service_pb2.ChatResponse) -> None:
        if not self._recording:
            return
        kind = event.WhichOneof("event")
        if kind == "started":
            started = event.started
            self.span.set_attribute("gen_ai.response.id", started.request_id)
            self.span.set_attribute("gen_ai.response.model", started.model)
            self.span.set_attribute("llmmesh.region", started.region)
            self.span.set_attribute("llmmesh.pod_id", started.pod_id)
        elif kind == "usage":
            record_usage(self.span, event.usage.usage)
        elif kind == "finished":
            record_finish(self.span, event.finished.reason)
        elif kind == "error":
            self.span.set_attribute("error.type", event.error.reason or "error")
            self.span.set_status(Status(StatusCode.ERROR, event.error.message))

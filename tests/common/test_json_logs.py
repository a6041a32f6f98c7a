"""JSON log lines: one object a line, with the request id and the trace
and span ids of the context that logged it, and neither outside one."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from llmmesh.core import tracing
from llmmesh.core.json_logs import JsonFormatter, bind_request_id, configure_logging, current_request_id


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(JsonFormatter("region"))
    logger = logging.getLogger("tests.json_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    tracing.install(TracerProvider())
    try:
        yield logger, lines
    finally:
        tracing.uninstall()
        logger.removeHandler(handler)


def entries(lines: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines.getvalue().splitlines()]


@pytest.mark.asyncio
async def test_a_line_logged_serving_a_traced_request_names_both(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, lines = logged

    async def serve(request_id: str) -> tuple[str, str]:
        bind_request_id(request_id)
        with tracing.span("chat llmmesh-tiny") as span:
            logger.warning("turn %s accepted", request_id)
            context = span.get_span_context()
            return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)

    # Two requests at once, each in its own task, each with its own ids.
    ids = await asyncio.gather(serve("chatcmpl-a"), serve("chatcmpl-b"))
    logger.info("idle")
    first, second, idle = entries(lines)
    for entry, request_id, (trace_id, span_id) in (
        (first, "chatcmpl-a", ids[0]),
        (second, "chatcmpl-b", ids[1]),
    ):
        assert entry["request_id"] == request_id
        assert entry["trace_id"] == trace_id and entry["span_id"] == span_id
        assert entry["message"] == f"turn {request_id} accepted"
        assert entry["level"] == "WARNING" and entry["plane"] == "region"
        assert entry["logger"] == "tests.json_logs"
    assert ids[0][0] != ids[1][0]
    assert "request_id" not in idle and "trace_id" not in idle
    assert current_request_id() == ""


def test_an_exception_is_part_of_its_line(logged: tuple[logging.Logger, io.StringIO]) -> None:
    logger, lines = logged
    try:
        raise ValueError("the pod answered nonsense")
    except ValueError:
        logger.exception("generation failed")
    [entry] = entries(lines)
    assert entry["message"] == "generation failed"
    assert "ValueError: the pod answered nonsense" in str(entry["exception"])


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log_format must be one of text, json"):
        configure_logging("edge", "info", "xml")

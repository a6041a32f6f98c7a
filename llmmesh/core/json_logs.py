"""Structured logs: one JSON object a line, for log pipelines (Loki,
Elasticsearch, Cloud Logging) to index without parsing text.

Every line names its time, level, logger, plane and message, and, when
the line is logged while serving a request, the request's id
(:func:`bind_request_id`, a context variable, so each turn's task carries
its own) and the trace and span the line belongs to
(:mod:`llmmesh.core.tracing`), so a log line leads to its trace and back.
Every plane's process chooses ``text`` (the default, for a terminal) or
``json`` with ``--log-format``/``LLMMESH_LOG_FORMAT``.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO

from opentelemetry import trace

from llmmesh.core.config import setting

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")

_request_id: ContextVar[str] = ContextVar("llmmesh_request_id", default="")


@dataclass(frozen=True)
class LogSettings:
    """How a process writes its log."""

    log_format: str = setting(
        "text", "log lines as text, or json: one object a line with request_id and trace_id"
    )


def bind_request_id(request_id: str) -> None:
    """Name the request the current task (and the tasks it starts) serves,
    for every line they log."""
    _request_id.set(request_id)


def current_request_id() -> str:
    """The request id bound in this context; empty when none."""
    return _request_id.get()


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object (see the module docstring)."""

    def __init__(self, plane: str) -> None:
        super().__init__()
        self._plane = plane

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "plane": self._plane,
            "message": record.getMessage(),
        }
        if request_id := _request_id.get():
            entry["request_id"] = request_id
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            entry["trace_id"] = trace.format_trace_id(context.trace_id)
            entry["span_id"] = trace.format_span_id(context.span_id)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def text_formatter(plane: str) -> logging.Formatter:
    """The human-readable format of a terminal."""
    return logging.Formatter(f"%(asctime)s [{plane}] %(levelname)s %(name)s: %(message)s")


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted, so a
    replaced stderr (a closed capture, a redirected console) is never written
    to after it is gone."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: object) -> None:
        pass


def configure_logging(plane: str, level: str, log_format: str = "text") -> None:
    """Send this process's log to stderr as ``log_format`` (``text`` or ``json``)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter(plane) if log_format == "json" else text_formatter(plane))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))

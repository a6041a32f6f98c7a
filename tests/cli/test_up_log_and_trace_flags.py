"""``llmmesh --log-format/--otlp-endpoint/--trace-sample-ratio up``: the
planes ``up`` starts read their settings from the environment they inherit,
so the flags are put there rather than configuring the supervisor alone."""

from __future__ import annotations

import os

import pytest

from llmmesh import config
from llmmesh.cli.main import _pass_log_and_trace_flags_on, build_parser
from llmmesh.json_logs import LogSettings
from llmmesh.tracing import TracingSettings

VARIABLES = ("LLMMESH_LOG_FORMAT", "LLMMESH_OTLP_ENDPOINT", "LLMMESH_TRACE_SAMPLE_RATIO")


def test_the_flags_reach_the_planes_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        # Set first, so that monkeypatch restores each as absent after the test;
        # a plain delenv of an absent variable records nothing to undo.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    args = build_parser().parse_args(
        [
            "--log-format",
            "json",
            "--otlp-endpoint",
            "http://127.0.0.1:4317",
            "--trace-sample-ratio",
            "0.5",
            "up",
        ]
    )
    _pass_log_and_trace_flags_on(args)
    # What a plane started by up then loads, from its environment alone.
    assert config.load(LogSettings).log_format == "json"
    tracing = config.load(TracingSettings)
    assert (tracing.otlp_endpoint, tracing.trace_sample_ratio) == ("http://127.0.0.1:4317", 0.5)


def test_without_the_flags_the_environment_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMMESH_LOG_FORMAT", "json")
    monkeypatch.setenv("LLMMESH_OTLP_ENDPOINT", "")
    monkeypatch.delenv("LLMMESH_OTLP_ENDPOINT")
    _pass_log_and_trace_flags_on(build_parser().parse_args(["up"]))
    assert os.environ["LLMMESH_LOG_FORMAT"] == "json"
    assert "LLMMESH_OTLP_ENDPOINT" not in os.environ

"""``llmmesh --log-format/--otlp-endpoint/--trace-sample-ratio up``: the
planes ``up`` starts read their settings from the environment they inherit,
so the flags are put there rather than configuring the supervisor alone."""

from __future__ import annotations

import os

import pytest

from llmmesh.cli.main import _pass_log_and_trace_flags_on, build_parser
from llmmesh.core import config
from llmmesh.core.json_logs import LogSettings
from llmmesh.core.tracing import TracingSettings

VARIABLES = ("LLMMESH_LOG_FORMAT", "LLMMESH_OTLP_ENDPOINT", "LLMMESH_TRACE_SAMPLE_RATIO", "LLMMESH_LOG_LEVEL")


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
    assert build_parser().parse_args(["global"]).log_level == "info"
    tracing = config.load(TracingSettings)
    assert (tracing.otlp_endpoint, tracing.trace_sample_ratio) == ("http://127.0.0.1:4317", 0.5)


def test_without_the_flags_the_environment_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMMESH_LOG_FORMAT", "json")
    monkeypatch.setenv("LLMMESH_OTLP_ENDPOINT", "")
    monkeypatch.delenv("LLMMESH_OTLP_ENDPOINT")
    monkeypatch.setenv("LLMMESH_LOG_LEVEL", "")  # restored as absent after the test
    monkeypatch.delenv("LLMMESH_LOG_LEVEL")
    _pass_log_and_trace_flags_on(build_parser().parse_args(["up"]))
    assert os.environ["LLMMESH_LOG_FORMAT"] == "json"
    assert "LLMMESH_OTLP_ENDPOINT" not in os.environ


def test_the_log_level_flag_reaches_the_planes_up_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMMESH_LOG_LEVEL", "")
    monkeypatch.delenv("LLMMESH_LOG_LEVEL")
    _pass_log_and_trace_flags_on(build_parser().parse_args(["--log-level", "debug", "up"]))
    assert os.environ["LLMMESH_LOG_LEVEL"] == "debug"
    # A plane up starts gets no --log-level flag: it takes the level from its environment.
    assert build_parser().parse_args(["global"]).log_level == "debug"
    # Its own flag still wins.
    assert build_parser().parse_args(["--log-level", "warning", "global"]).log_level == "warning"


def test_the_log_level_is_info_without_flag_or_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMMESH_LOG_LEVEL", "")
    monkeypatch.delenv("LLMMESH_LOG_LEVEL")
    assert build_parser().parse_args(["global"]).log_level == "info"
    monkeypatch.setenv("LLMMESH_LOG_LEVEL", "error")
    args = build_parser().parse_args(["up"])
    _pass_log_and_trace_flags_on(args)
    assert (args.log_level, os.environ["LLMMESH_LOG_LEVEL"]) == ("error", "error")
    monkeypatch.delenv("LLMMESH_LOG_LEVEL")
    _pass_log_and_trace_flags_on(build_parser().parse_args(["up"]))
    # The default needs no variable: the planes take info without one.
    assert "LLMMESH_LOG_LEVEL" not in os.environ

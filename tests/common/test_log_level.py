"""An unknown log level is refused at start, never turned into INFO."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from llmmesh.core.json_logs import configure_logging


def test_configure_logging_refuses_an_unknown_level() -> None:
    with pytest.raises(ValueError, match="verbose"):
        configure_logging("test", "verbose")


def test_configure_logging_takes_a_known_level_in_any_case() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("test", "WARNING")
        assert root.level == logging.WARNING
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.parametrize(
    ("args", "env"), [(["--log-level", "verbose"], {}), ([], {"LLMMESH_LOG_LEVEL": "verbose"})]
)
def test_the_cli_refuses_an_unknown_level_in_one_line(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(
        # An unknown flag too: the run never starts a plane, whatever the level check does.
        [sys.executable, "-m", "llmmesh", *args, "region", "--no-such-flag"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "verbose" in done.stderr.splitlines()[-1]

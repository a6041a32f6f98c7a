"""What the drill tests share: the short drill settings, running
``llmmesh drill failover`` against a running ``llmmesh up``, and what every
drill's report must show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from tests.e2e.conftest import RunningMesh

SHORT = [
    "--streams", "8", "--max-tokens", "64", "--disrupt-after-s", "3", "--restore-after-s", "4",
    "--duration-s", "3", "--turn-timeout-s", "60", "--restore-timeout-s", "90", "--usage-wait-s", "30",
]  # fmt: skip
DRILL_TIMEOUT_S = 240.0
FIELDS = {
    "streams_total", "streams_affected", "turns_total", "turns_done", "turns_failed_clearly", "turns_lost",
    "tokens_received", "tokens_lost", "tokens_duplicated", "token_count_source", "stall_p50_s",
    "stall_p99_s", "time_to_exclude_s", "time_to_return_s", "restored", "residency", "usage",
    "usage_records_lost", "errors", "passed",
}  # fmt: skip


def drill(
    mesh: RunningMesh, *flags: str, settings: Sequence[str] = SHORT, timeout_s: float = DRILL_TIMEOUT_S
) -> dict[str, Any]:
    """Run the drill with ``settings`` and ``flags``; its last stdout line, parsed."""
    result = subprocess.run(
        [sys.executable, "-m", "llmmesh", "drill", "failover", "--json", *settings, *flags],
        env={**os.environ, "LLMMESH_HOME": str(mesh.home)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert result.returncode == 0, result.stderr
    assert "llmmesh drill: [" in result.stderr  # progress while it ran
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert isinstance(report, dict)
    return report


def assert_clean(report: dict[str, Any]) -> None:
    """What every drill must show, failover or not."""
    assert set(report) >= FIELDS, FIELDS - set(report)
    residency = report["residency"]
    assert isinstance(residency, dict) and residency["held"] is True, residency
    assert report["turns_lost"] == 0, report["errors"]
    assert report["tokens_duplicated"] == 0
    assert report["sequence_repeats"] == 0
    assert report["token_count_source"] == "tokenizer" and report["turns_uncounted"] == 0
    assert report["restored"] is True
    assert report["turns_total"] == report["turns_done"] + report["turns_failed_clearly"]

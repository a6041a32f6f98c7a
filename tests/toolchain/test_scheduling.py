"""The test scheduler's figures: seconds per file from a JUnit report, and
the durations file read back (a broken one only loses the order)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tests.scheduling import UNKNOWN_S_PER_TEST, LongestFileFirst, is_heavy, load_durations

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test_durations.py"

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.e2e.test_up" name="test_a" time="10.5"/>
<testcase classname="tests.e2e.test_up" name="test_b[x]" time="2.0"/>
<testcase classname="tests.edge.test_app.TestHeaders" name="test_c" time="1.25"/>
<testcase classname="tests.vllm.test_vllm_pod" name="test_d" time="300"/>
</testsuite></testsuites>
"""


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("test_durations_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_test_cases_of_a_report_add_up_per_file(tmp_path: Path) -> None:
    report = tmp_path / "run.xml"
    report.write_text(REPORT)
    assert _script().durations(report) == {
        "tests/e2e/test_up.py": 12.5,
        "tests/edge/test_app.py": 1.2,
        "tests/vllm/test_vllm_pod.py": 300.0,
    }


def test_the_durations_file_is_read_back_and_a_broken_one_is_no_figures(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text('{"tests/a.py": 12.5, "tests/b.py": 3, "tests/c.py": "x"}')
    assert load_durations(good) == {"tests/a.py": 12.5, "tests/b.py": 3.0}
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert load_durations(broken) == {}
    assert load_durations(tmp_path / "missing.json") == {}
    # The committed file names files of this suite.
    committed = load_durations()
    assert committed and all((SCRIPT.parents[1] / name).is_file() for name in committed), committed


def test_a_file_without_a_figure_counts_per_test() -> None:
    scheduler = LongestFileFirst.__new__(LongestFileFirst)
    scheduler.durations = {"tests/a.py": 50.0}
    assert scheduler.expected_s("tests/a.py", 3) == 50.0
    assert scheduler.expected_s("tests/new.py", 4) == 4 * UNKNOWN_S_PER_TEST


def test_at_most_two_heavy_files_run_while_others_are_left() -> None:
    scheduler = LongestFileFirst.__new__(LongestFileFirst)
    scheduler.durations = {"tests/vllm/test_vllm_pod.py": 300.0, "tests/edge/test_app.py": 40.0}
    queue = {"tests/vllm/test_vllm_pod.py": {"a": False}, "tests/edge/test_app.py": {"b": False}}
    assert scheduler.next_file(queue, 1) == "tests/vllm/test_vllm_pod.py"
    assert scheduler.next_file(queue, 2) == "tests/edge/test_app.py"
    # Nothing else left: the heavy file goes out all the same (a worker asking is never left idle).
    only_heavy = {"tests/vllm/test_vllm_pod.py": {"a": False}}
    assert scheduler.next_file(only_heavy, 2) == "tests/vllm/test_vllm_pod.py"
    assert is_heavy("tests/toolchain/test_toolchain.py") and not is_heavy("tests/toolchain/test_readme.py")

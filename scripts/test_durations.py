"""Write ``tests/durations.json``, the seconds each test file took, from a
JUnit report of a whole run (``pytest --junitxml=REPORT.xml``). The test
scheduler (``tests/scheduling.py``) hands the longest files out first.

Usage: python scripts/test_durations.py REPORT.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "durations.json"


def durations(report: Path) -> dict[str, float]:
    """Seconds per file: the sum of its test cases' times (setup, call and
    teardown), keyed as pytest names the file."""
    seconds: defaultdict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "")
        # "tests.e2e.test_up.TestX" or "tests.e2e.test_up": the module is the
        # part up to the first capitalised name.
        parts = [part for part in module.split(".") if part]
        while parts and parts[-1][:1].isupper():
            parts.pop()
        if parts:
            seconds["/".join(parts) + ".py"] += float(case.get("time", "0") or 0)
    return {name: round(total, 1) for name, total in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    found = durations(Path(argv[0]))
    if not found:
        print(f"no test cases in {argv[0]}", file=sys.stderr)
        return 1
    OUT.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    print(f"{OUT}: {len(found)} files, {sum(found.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

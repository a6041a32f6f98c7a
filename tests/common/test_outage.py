"""OutageGate: while the global plane is down, one caller probes per interval
and the others use their stale answers at once."""

from __future__ import annotations

import pytest

from llmmesh.core.outage import OutageGate


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_callers_ask_until_a_failure_then_one_probes_per_interval() -> None:
    clock = Clock()
    gate = OutageGate(probe_s=2.0, clock=clock)
    assert not gate.skip() and not gate.skip()  # up: everyone asks
    gate.failed()
    assert [gate.down] == [True]
    assert gate.skip() and gate.skip()  # down: stale answers, no waiting
    clock.now += 2.0
    assert not gate.skip()  # this caller probes
    assert gate.skip()  # the others keep using stale answers meanwhile
    gate.failed()
    assert gate.skip()
    clock.now += 2.0
    assert not gate.skip()
    gate.answered()
    assert not gate.down
    assert not gate.skip() and not gate.skip()


def test_the_probe_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="probe_s"):
        OutageGate(probe_s=0)

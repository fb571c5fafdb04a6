"""Fake clocks for the tests of time limits, so that what a limit cuts is counted in clock
readings and is the same on every machine.

Code that takes a clock gets one directly (:func:`autoshard.plan`'s ``clock``, the torchrec
sharder's ``clock`` attribute). The deadline code of ``recshard``, ``ppo``, the policy's decode
and the search stage reads the time through ``time.perf_counter()`` at each use, so a test
puts the fake clock there for the run (:func:`fake_perf_counter`). HiGHS keeps its own
wall-clock limit, set from what the fake clock says is left: a test whose MILP result must be
the same everywhere gives it a limit that the solve ends far before (by its gap or stall rule).

How long a limited run takes in wall seconds is measured by ``benchmarks/``, never asserted by a
test.
"""

from __future__ import annotations

import time

import pytest

#: Seconds a step clock advances at each reading unless a test says otherwise: coarse enough
#: that a run's deadlines come after a few hundred readings.
STEP_S = 0.05


class StepClock:
    """A clock that advances ``step_s`` at each reading.

    Args:
        step_s: Seconds added at each reading.

    Attributes:
        now: The last reading, s (0 before the first).
        readings: How many times it was read.
    """

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.now = 0.0
        self.readings = 0

    def __call__(self) -> float:
        self.now += self.step_s
        self.readings += 1
        return self.now


def fake_perf_counter(monkeypatch: pytest.MonkeyPatch, step_s: float = STEP_S) -> StepClock:
    """A :class:`StepClock` put in place of ``time.perf_counter`` until the test ends (or
    ``monkeypatch.undo()``)."""
    clock = StepClock(step_s)
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock

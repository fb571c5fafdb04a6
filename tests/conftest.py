r"""Shared fixtures, and the rules every test keeps.

- No test asserts how long something took, in wall or CPU seconds, nor a result that depends on
  how much work fits in a time limit: limits are kept on a fake clock (``tests/clocks.py``) or
  counted in steps, and timings live in ``benchmarks/``. ``tests/test_no_wall_clock.py`` checks
  the asserts; ``grep -rnE "assert .*(perf_counter|monotonic|process_time|time\.time)\(" tests
  --exclude=test_no_wall_clock.py`` finds none.
- A test that takes more than a few seconds on 2 CPU cores is marked ``@pytest.mark.slow``, so
  that ``pytest -m "not slow"`` stays a quick check.
"""

from __future__ import annotations

import pytest
from clocks import StepClock, fake_perf_counter
from handcase import hand_task_of

from autoshard.task import ShardingTask


@pytest.fixture
def hand_task() -> ShardingTask:
    """Tables A, B, C (36,000, 18,000, 18,000 B) on two devices of 36,000 B of HBM each."""
    return hand_task_of()


@pytest.fixture
def step_clock(monkeypatch: pytest.MonkeyPatch) -> StepClock:
    """``time.perf_counter`` replaced by a step clock for the test (:mod:`clocks`), so that what
    the sharders' time limits cut is the same on every machine."""
    return fake_perf_counter(monkeypatch)

"""The torchrec sharder keeps its time limit on its own clock, on tasks of the default tables
(the original probe: it ran 6.2 s on the 856 default tables on 8 devices with a limit of 1 s).

The clock is a fake one that advances a fixed step at each reading, so what the limit cuts is
counted in the sharder's own steps and is the same on every machine; how long a limited run
takes in wall seconds is measured by ``benchmarks/bench_time_limits.py``. recshard's limit is
tested the same way in ``test_recshard_deadline.py``.
"""

from __future__ import annotations

import math
from functools import cache

import pytest
from clocks import StepClock

from autoshard.cli.common import build_task
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders import get_sharder, sharder_info
from autoshard.sharders.base import Sharded
from autoshard.synth import default_tables
from autoshard.task import ShardingTask
from autoshard.torchrec.sharder import TorchRecSharder
from autoshard.workloads import constrained_task

MODEL = AnalyticalCostModel()
LIMIT_S = 2.0
#: Seconds the fake clock advances at each reading.
STEP_S = 0.1
#: What a run may read past its limit: the readings after the last proposal's check.
SLACK_S = 5 * STEP_S


def _constrained() -> ShardingTask:
    """200 default tables on 8 devices whose HBM holds 30% of their bytes (TorchRec's runtime
    reserved): the sharders have to search."""
    return constrained_task(default_tables()[:200], 8, 0.3, reservation="torchrec")


def _probe() -> ShardingTask:
    """The original probe's task: `plan -t default --devices 8` (856 tables)."""
    return build_task("default", "8xH100-80GB", devices=8)


def _timed_torchrec(limit_s: float) -> tuple[TorchRecSharder, StepClock]:
    """The torchrec sharder with a time limit of ``limit_s``, kept on a fresh step clock."""
    if sharder_info("torchrec").unavailable:
        pytest.skip("the torchrec extra is not installed")
    sharder = get_sharder("torchrec", time_limit=limit_s)
    clock = StepClock(STEP_S)
    sharder.clock = clock  # type: ignore[attr-defined]
    return sharder, clock  # type: ignore[return-value]


@cache
def _probe_run() -> tuple[Sharded, StepClock]:
    """The torchrec sharder's run on :func:`_probe` with a limit of :data:`LIMIT_S`, and its
    clock after it (made once for this module's tests)."""
    sharder, clock = _timed_torchrec(LIMIT_S)
    return sharder.solve(_probe(), MODEL), clock


@pytest.mark.slow
def test_torchrec_keeps_its_time_limit_on_its_clock() -> None:
    task = _probe()
    sharded, clock = _probe_run()
    assert clock.now <= LIMIT_S + SLACK_S, (
        f"torchrec read {clock.now:.2f} s on its clock with a limit of {LIMIT_S} s; notes: "
        f"{sharded.notes}")
    assert math.isfinite(evaluate(sharded.plan, task, MODEL).step_cost_ms)


@pytest.mark.slow
def test_torchrec_says_what_a_short_limit_cut() -> None:
    task = _constrained()
    sharder, clock = _timed_torchrec(LIMIT_S)
    sharded = sharder.solve(task, MODEL)
    assert clock.now <= LIMIT_S + SLACK_S
    assert math.isfinite(evaluate(sharded.plan, task, MODEL).step_cost_ms)
    # 200 tables x 8 devices at full strength: TorchRec's enumeration alone would take longer
    # than the limit, so the split types go to the dominant tables only, and that is said; so
    # is the second cache start it had no time for.
    assert any("split sharding types offered to" in note for note in sharded.notes)
    assert any("not tried" in note for note in sharded.notes)


@pytest.mark.slow
def test_torchrec_offers_fused_alone_only_where_hbm_holds_every_table() -> None:
    task = _probe()  # 856 tables of 130 GB on 640 GB of HBM: every kernel takes too long
    sharded, _ = _probe_run()
    plan = sharded.plan
    assert any("fused kernel alone" in note for note in sharded.notes)
    rows = {t.name: t.rows for t in task.tables}
    assert all(p.hbm_rows == rows[p.table] for p in plan.placements)  # nothing in UVM
    # 30% of the bytes in HBM: the UVM kernels stay, at any limit.
    roomy, clock = _timed_torchrec(5 * LIMIT_S)
    notes = roomy.solve(_constrained(), MODEL).notes
    assert not any("fused kernel alone" in note for note in notes)
    assert clock.now > LIMIT_S + SLACK_S  # it used more: the shorter limit cuts a run

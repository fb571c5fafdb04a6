"""The MILP sharder: known optima on hand-checkable cases, never worse than the greedy family,
a valid plan and an honest gap under a time limit, valid lower bounds."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from clocks import fake_perf_counter

from autoshard.access import AccessCurve
from autoshard.cli import main
from autoshard.errors import PlannerError
from autoshard.hardware import GB, load_hardware
from autoshard.layout.plan import check_plan
from autoshard.layout.shards import check_layout, whole_tables
from autoshard.layout.splitting import split_heavy_tables
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.bounds import lower_bound_ms, relax
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders import get_sharder
from autoshard.sharders.recshard import RecShard, _beats_whole, recshard_bound
from autoshard.tables import Table, save_tables
from autoshard.task import ShardingTask, Workload
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()
GREEDY = ("size_greedy", "dim_greedy", "lookup_greedy", "size_lookup_greedy")


def _uniform_task(pooling: list[float], devices: int, hbm_tables: float,
                  batch_size: int = 4096) -> ShardingTask:
    """Equal tables (1000 rows, dim 64, every row equally hot) differing only in pooling factor;
    each device's HBM holds ``hbm_tables`` whole tables."""
    tables = tuple(Table(f"t{i}", rows=1000, dim=64, pooling_factor=p,
                         access_cdf=AccessCurve.uniform()) for i, p in enumerate(pooling))
    per_table = tables[0].rows * tables[0].memory_bytes_per_row(True)
    hw = load_hardware("8xH100-80GB", devices=devices, hbm_gb=hbm_tables * per_table / GB)
    return ShardingTask(tables, hw, Workload(batch_size=batch_size))


def _brute_force(task: ShardingTask) -> float:
    """Optimum by enumeration: every assignment; on each device, HBM bytes go to the tables with
    the largest saving per byte first (exact here: with uniform access, cost is linear in HBM
    rows, so each device's split is a fractional knapsack)."""
    n, d = task.num_tables, task.num_devices
    idx = np.arange(n)
    rows = task.table_arrays.rows
    per_row = task.table_arrays.memory_bytes_per_row
    cold = MODEL.price(task, idx, np.zeros(n, int), np.zeros(n)).total_ms
    hot = MODEL.price(task, idx, np.zeros(n, int), rows).total_ms
    saving_per_byte = (cold - hot) / (rows * per_row)
    best = np.inf
    for assign in itertools.product(range(d), repeat=n):
        loads = []
        for dev in range(d):
            on = [t for t in range(n) if assign[t] == dev]
            room = task.device_arrays.hbm_capacity[dev]
            load = 0.0
            for t in sorted(on, key=lambda t: -saving_per_byte[t]):
                use = min(room, rows[t] * per_row[t])
                room -= use
                load += cold[t] - saving_per_byte[t] * use
            loads.append(load)
        best = min(best, max(loads))
    return float(best)


def test_three_tables_on_two_devices_finds_the_known_optimum() -> None:
    # HBM per device holds 1.5 tables: the optimum pairs the two light tables and splits HBM.
    task = _uniform_task([4.0, 2.0, 1.0], devices=2, hbm_tables=1.5)
    optimum = _brute_force(task)
    result = RecShard(time_limit=20, split=False).solve(task, MODEL).details
    check_plan(result.plan, task)
    assert result.step_cost_ms == pytest.approx(optimum, rel=1e-6)
    assert result.bound_ms <= optimum * (1 + 1e-9)
    device, rows = result.plan.arrays(task)
    assert device[1] == device[2] != device[0]
    assert list(rows) == [1000, 1000, 500]  # the hotter light table whole, half the other
    assert evaluate(result.plan, task, MODEL).step_cost_ms == pytest.approx(result.step_cost_ms)


def test_beats_longest_processing_time_on_its_counterexample() -> None:
    # Loads 3,3,2,2,2 on two devices: greedy (LPT) ends at 3+2+2 against 3+3 | 2+2+2.
    task = _uniform_task([30.0, 30.0, 20.0, 20.0, 20.0], devices=2, hbm_tables=5.0,
                         batch_size=65536)
    optimum = _brute_force(task)
    result = RecShard(time_limit=20, split=False).solve(task, MODEL).details
    greedy = evaluate(get_sharder("lookup_greedy").shard(task, MODEL), task, MODEL)
    assert result.step_cost_ms == pytest.approx(optimum, rel=1e-6)
    assert greedy.step_cost_ms > optimum * 1.05
    device, _ = result.plan.arrays(task)
    assert device[0] == device[1] != device[2]


@pytest.mark.usefixtures("step_clock")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_never_worse_than_any_greedy_on_small_random_tasks(seed: int) -> None:
    task = constrained_task(dlrm_tables(10, seed=seed), 2 + seed % 2, hbm_fraction=0.3)
    result = RecShard(time_limit=5).solve(task, MODEL).details
    check_layout(result.plan, task)
    for name in GREEDY:
        try:
            greedy = evaluate(get_sharder(name).shard(task, MODEL), task, MODEL)
        except PlannerError:
            continue
        assert result.step_cost_ms <= greedy.step_cost_ms * (1 + 1e-9), name
    assert result.bound_ms <= result.step_cost_ms
    assert result.bound_ms >= lower_bound_ms(task, MODEL, replicas=True) * (1 - 1e-6)


@pytest.mark.usefixtures("step_clock")
def test_time_limit_returns_a_valid_plan_with_a_gap() -> None:
    task = constrained_task(dlrm_tables(40, seed=5), 4, hbm_fraction=0.3)
    sharded = RecShard(time_limit=0.2).solve(task, MODEL)
    plan, result = sharded.plan, sharded.details
    check_layout(plan, task)
    # How far the solve gets in 0.2 s depends on the machine (on a loaded one, only the warm
    # start), so only what holds on every path is asserted.
    assert 0.0 <= result.gap <= 1.0
    assert sharded.bound_ms == result.bound_ms <= result.step_cost_ms
    assert result.step_cost_ms <= result.warm_cost_ms
    if result.gap < 1.0:
        report = evaluate(plan, task, MODEL, bound_ms=sharded.bound_ms)
        assert report.cost_ratio == pytest.approx(1.0 / (1.0 - result.gap), rel=1e-6)


@pytest.mark.usefixtures("step_clock")
def test_lp_bound_is_valid_and_at_least_the_simple_bound_on_mixed_devices() -> None:
    tables = dlrm_tables(12, seed=7)
    task = constrained_task(tables, 4, hbm_fraction=0.4)
    hw = task.hardware
    small = hw.devices[0].hbm.capacity_bytes // 4
    from dataclasses import replace

    devices = tuple(replace(d, hbm=replace(d.hbm, capacity_bytes=small)) if i % 2 else d
                    for i, d in enumerate(hw.devices))
    mixed = ShardingTask(task.tables, replace(hw, devices=devices), task.workload)
    bound = recshard_bound(mixed, MODEL)
    assert bound >= lower_bound_ms(mixed, MODEL) * (1 - 1e-9)
    result = RecShard(time_limit=5, split=False).solve(mixed, MODEL).details
    assert bound <= result.step_cost_ms * (1 + 1e-9)
    # It bounds whole-table plans only: splitting may go below it, never below the simple bound.
    split = RecShard(time_limit=5).solve(mixed, MODEL).details
    assert lower_bound_ms(mixed, MODEL) <= split.step_cost_ms * (1 + 1e-9)


def test_registry_builds_it_with_options() -> None:
    sharder = get_sharder("recshard", time_limit=2.0, seed=3, split=False)
    assert isinstance(sharder, RecShard) and sharder.time_limit == 2.0
    task = _uniform_task([1.0, 1.0], devices=2, hbm_tables=1.01)
    device, rows = sharder.shard(task, MODEL).arrays(task)
    assert sorted(device) == [0, 1] and (rows == 1000).all()


def test_cli_evaluate_takes_the_lp_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    tables, plan = tmp_path / "t.json", tmp_path / "p.json"
    save_tables(tables, dlrm_tables(6, seed=1))
    args = ["-t", str(tables), "--devices", "2", "--hbm-gb", "0.3"]
    main(["plan", *args, "-s", "lookup_greedy", "-o", str(plan), "--json"])
    capsys.readouterr()
    main(["evaluate", str(plan), *args, "--json"])
    simple = json.loads(capsys.readouterr().out)["lower_bound_ms"]
    main(["evaluate", str(plan), *args, "--json", "--bound", "lp"])
    with_lp = json.loads(capsys.readouterr().out)["lower_bound_ms"]
    assert simple * (1 - 1e-9) <= with_lp
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", str(plan), *args, "--bound", "exact"])
    assert exit_info.value.code == 2 and "--bound" in capsys.readouterr().err


def _dominated_task(devices: int) -> ShardingTask:
    """Small tables and one huge, hot one (DCNv2's shape in miniature)."""
    tables = (*dlrm_tables(10, seed=3),
              Table("huge", rows=2_000_000, dim=128, pooling_factor=100.0, zipf_alpha=1.05))
    return constrained_task(tables, devices, hbm_fraction=0.3)


@pytest.mark.usefixtures("step_clock")
def test_splits_the_dominant_table() -> None:
    task = _dominated_task(4)
    whole = RecShard(time_limit=5, split=False).solve(task, MODEL).details
    split = RecShard(time_limit=5).solve(task, MODEL).details
    report = check_layout(split.plan, task)
    assert report.num_shards > task.num_tables
    huge = next(p for p in split.plan.placements if p.table == "huge")
    assert huge.is_split and len({s.device for s in huge.shards}) > 1
    assert split.step_cost_ms < whole.step_cost_ms / 2
    # The table-wise plan is held up by the huge table; its whole-table bound says so.
    assert whole.step_cost_ms >= lower_bound_ms(task, MODEL, whole_tables=True) * (1 - 1e-9)
    assert lower_bound_ms(task, MODEL) <= split.bound_ms <= split.step_cost_ms
    assert split.gap == pytest.approx((split.step_cost_ms - split.bound_ms) / split.step_cost_ms)
    assert evaluate(split.plan, task, MODEL).step_cost_ms == pytest.approx(split.step_cost_ms)



def test_reachable_target_splits_no_finer_than_the_dearest_table_allows() -> None:
    """Below what the dearest table can be split into, every table would be cut to its
    finest; the reachable target rises to that table's cheapest dearest shard instead, so the
    others are split only where they cost more whole than it, and more coarsely."""
    task = _dominated_task(4)
    low = 0.05 * lower_bound_ms(task, MODEL)
    fine = split_heavy_tables(task, MODEL, low)
    coarse = split_heavy_tables(task, MODEL, low, reachable=True)
    assert fine.target_ms == low < coarse.target_ms
    assert coarse.geometry.num_shards < fine.geometry.num_shards
    split = coarse.split_tables
    assert (coarse.whole_ms[split] > coarse.target_ms).all()
    kept = np.setdiff1d(np.arange(task.num_tables), split)
    assert (coarse.whole_ms[kept] <= coarse.target_ms).all()
    # The huge table sets the target and is still split.
    assert task.num_tables - 1 in split.tolist()


@pytest.mark.usefixtures("step_clock")
def test_whole_tables_are_not_planned_once_a_split_plan_beats_their_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    task = _dominated_task(4)
    whole_bound = lower_bound_ms(task, MODEL, whole_tables=True)
    g = whole_tables(task)
    assert _beats_whole(task, MODEL, g, 0.99 * whole_bound, np.inf)
    assert not _beats_whole(task, MODEL, g, whole_bound, np.inf)
    split = split_heavy_tables(task, MODEL).geometry
    assert not _beats_whole(task, MODEL, split, 0.0, np.inf)  # only the whole-table choice
    planned: list[bool] = []
    solve_tables = RecShard._solve_tables

    def recording(self: RecShard, sub: ShardingTask, *args: object, **kwargs: object
                  ) -> object:
        planned.append(sub is task)  # the whole-table choice is priced on the task itself
        return solve_tables(self, sub, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RecShard, "_solve_tables", recording)
    result = RecShard(time_limit=3).solve(task, MODEL).details
    assert result.step_cost_ms < whole_bound and planned and not any(planned)


@pytest.mark.usefixtures("step_clock")
def test_on_tasks_too_large_for_the_milp_one_split_choice_with_a_capped_search(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``max_pairs`` only the first split choice is solved (then the whole tables, unless
    beaten), and its search is capped; the whole-table solve is not."""
    task = _dominated_task(4)
    assert len(RecShard._split_choices(task, MODEL, relax(task, MODEL), lower_bound_ms(
        task, MODEL), np.inf)) >= 2
    calls: list[tuple[bool, bool]] = []
    solve_tables = RecShard._solve_tables

    def recording(self: RecShard, sub: ShardingTask, *args: object, **kwargs: object
                  ) -> object:
        calls.append((sub is task, kwargs.get("search_cap") is not None))
        return solve_tables(self, sub, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RecShard, "_solve_tables", recording)
    RecShard(time_limit=5, max_pairs=task.num_tables * task.num_devices - 1).solve(task, MODEL)
    assert [c for c in calls if not c[0]] == [(False, True)]
    assert all(not capped for whole, capped in calls if whole)
    calls.clear()
    RecShard(time_limit=5).solve(task, MODEL)
    assert sum(not whole for whole, _ in calls) >= 2  # small enough: the finer choice too
    calls.clear()
    RecShard(time_limit=5, max_pairs=1, split_search_cap=None).solve(task, MODEL)
    assert sum(not whole for whole, _ in calls) >= 2 and not any(c for _, c in calls)


def test_convex_shortcut_gives_the_monotone_chain_hulls() -> None:
    from autoshard.pricing.curves import _hull_vertices, lower_hulls

    rng = np.random.default_rng(0)
    x = np.sort(rng.integers(0, 12, size=(200, 9)), axis=1).astype(float)
    y = np.where(rng.random((200, 1)) < 0.5, (x - 5.0) ** 2, rng.random((200, 9)))
    # Repeated x carry their first copy's y (as cost_curves builds them).
    first = np.ones(x.shape, dtype=bool)
    first[:, 1:] = x[:, 1:] != x[:, :-1]
    source = np.maximum.accumulate(np.where(first, np.arange(9)[None, :], 0), axis=1)
    y = np.take_along_axis(y, source, axis=1)
    fast, slow = _hull_vertices(x, y, first), lower_hulls(x, y)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
               for a, b in zip(fast, slow, strict=True))
    assert sum(a[0].size == np.unique(x[i]).size for i, a in enumerate(fast)) >= 50


def test_stops_when_the_milp_no_longer_improves(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the public Criteo 1TB tables (26 x 8, the CLI's hardware) the warm start is never
    bettered: the whole MILP stops by its stall rule, long before the time limit, and the
    report says how it stopped, its bound and gap, and when the plan was found. On a fake
    clock (0.05 s a reading), so that the stall rule counts the same steps on every machine."""
    from autoshard.hardware import load_hardware
    from autoshard.public_models import model_tables
    from autoshard.reservation import get_reservation
    from autoshard.task import Workload

    task = ShardingTask(tuple(model_tables("criteo1tb")), load_hardware("8xH100-80GB"),
                        Workload(), get_reservation("torchrec"))
    clock = fake_perf_counter(monkeypatch, 0.05)
    report = RecShard(time_limit=30.0).solve(task, MODEL).details.report()
    monkeypatch.undo()
    assert report["status"] == "stalled"
    assert 0.0 <= report["found_s"] <= report["seconds"] <= clock.now < 30.0 / 2
    assert report["bound_ms"] > 0.0 and 0.0 <= report["gap"] < 1.0


def test_the_milp_stall_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """A search whose last half brought less than ``stall`` stops; one still improving does
    not; no stall rule before ``min_seconds`` or with ``stall`` 0 (on a clock that stands
    still at 0)."""
    from autoshard.milp.model import stalled

    fake_perf_counter(monkeypatch, 0.0)
    now = 0.0
    flat = [(now - 4.0, np.inf), (now - 3.9, 10.0), (now - 0.5, 9.99)]
    assert stalled(flat, 5e-3, 1.0)
    improving = [(now - 4.0, np.inf), (now - 3.9, 10.0), (now - 0.5, 9.0)]
    assert not stalled(improving, 5e-3, 1.0)
    assert not stalled(flat, 0.0, 1.0) and not stalled(flat, 5e-3, 10.0)


@pytest.mark.usefixtures("step_clock")
def test_a_split_choice_whose_bound_is_not_below_the_best_is_skipped() -> None:
    """DCNv2's tables on 16 devices of 80 GB: the replicated choices cost less than any plan
    of the unreplicated ones can (their shards' bounds), so those need no solve, and the plan
    is below every one of their bounds."""
    import time

    from autoshard.layout import kinds
    from autoshard.layout.shards import pricing_task
    from autoshard.public_models import model_tables
    from autoshard.reservation import get_reservation
    from autoshard.sharders.recshard import _cannot_beat

    task = ShardingTask(tuple(model_tables("dcnv2")), load_hardware("8xH100-80GB", devices=16),
                        Workload(), get_reservation("torchrec"))
    model = AnalyticalCostModel()
    sharder = RecShard(time_limit=60)
    choices, _ = sharder._choices(task, model, time.perf_counter())
    later = time.perf_counter() + 60
    bounds = {}
    for i, g in enumerate(choices):
        sub = pricing_task(task, g)
        bounds[i] = lower_bound_ms(sub, model, reserved=True)
        assert _cannot_beat(sub, model, bounds[i], later)
        assert not _cannot_beat(sub, model, 1.01 * bounds[i], later)
    unreplicated = [bounds[i] for i, g in enumerate(choices)
                    if not kinds.replicated(g.kind).any()]
    assert unreplicated
    cost = evaluate(sharder.shard(task, model), task, model).step_cost_ms
    assert cost < min(unreplicated)

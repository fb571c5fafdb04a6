"""Sharders: the registry, the six baselines on the hand case, and properties on random tasks."""

from __future__ import annotations

import numpy as np
import pytest
from handcase import hand_profile, hand_tables, reference_price_ms
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoshard.errors import InputError, PlannerError
from autoshard.layout.plan import check_plan
from autoshard.layout.shards import check_layout, shard_memory
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.sharders import (
    common_options,
    get_sharder,
    list_sharders,
    sharder_info,
    sharder_names,
)
from autoshard.tables import Table
from autoshard.task import ShardingTask, Workload

MODEL = AnalyticalCostModel()
BASELINES = ("random", "round_robin", "size_greedy", "dim_greedy", "lookup_greedy",
             "size_lookup_greedy")
GREEDY = BASELINES[2:]


def test_registry_lists_the_baselines() -> None:
    names = sharder_names()
    assert set(BASELINES) <= set(names)
    infos = {i.name: i for i in list_sharders()}
    for name in BASELINES:
        assert infos[name].unavailable is None and infos[name].summary
    assert sharder_info("size_greedy").name == "size_greedy"


def test_unknown_sharder_names_the_value() -> None:
    with pytest.raises(InputError, match="'nope'") as info:
        get_sharder("nope")
    assert info.value.field == "sharder"


def test_options_are_strict_and_common_ones_filtered() -> None:
    assert get_sharder("random", seed=3).seed == 3  # type: ignore[attr-defined]
    with pytest.raises(InputError, match=r"accepted: none") as info:
        get_sharder("round_robin", seed=3)
    assert info.value.field == "round_robin.seed"
    with pytest.raises(InputError, match=r"accepted: split") as info:
        get_sharder("size_greedy", seed=3)
    assert info.value.field == "size_greedy.seed"
    with pytest.raises(InputError, match=r"unknown option.*accepted: time_limit, .*seed"):
        get_sharder("recshard", time_limt=1.0)
    with pytest.raises(InputError, match="expected float"):
        get_sharder("recshard", time_limit="soon")
    assert get_sharder("recshard", time_limit=2).time_limit == 2  # type: ignore[attr-defined]
    # None only where the option's annotation allows it.
    assert get_sharder("recshard", split_search_cap=None).split_search_cap is None  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="expected float"):
        get_sharder("recshard", time_limit=None)
    common = {"seed": 3, "time_limit": 5.0}
    assert common_options("size_greedy", common) == {}
    assert common_options("random", common) == {"seed": 3}
    assert common_options("recshard", common) == common


@pytest.mark.parametrize("name", [*GREEDY, "round_robin"])
def test_deterministic_baselines_find_the_hand_optimum(hand_task: ShardingTask,
                                                        name: str) -> None:
    # Only A | B + C keeps every row in HBM; it is the optimum (see test_evaluator).
    plan = get_sharder(name).shard(hand_task, MODEL)
    device, hbm = check_plan(plan, hand_task)
    assert device[1] == device[2] != device[0]
    assert list(hbm) == [1000, 500, 500]
    optimum = sum(sum(reference_price_ms(t, 1.0, 2)) for t in hand_tables()[1:])
    assert evaluate(plan, hand_task, MODEL).step_cost_ms == pytest.approx(optimum, rel=1e-12)
    assert plan.sharder == name


def test_greedy_splits_a_table_that_fits_no_hbm() -> None:
    # 30,000 B of HBM per device (36 B per row in train mode). size_greedy takes A first; A
    # (36,000 B) fits whole nowhere, so it is split: the 833 rows that fit (29,988 B) in HBM,
    # the rest in host memory. B (18,000 B) fits whole only on the other device, leaving
    # 12,000 B there; C then fits whole nowhere and keeps 12,000 / 36 = 333 rows in HBM there.
    task = ShardingTask(hand_tables(), hand_profile(hbm_bytes=30_000), Workload(batch_size=1000))
    plan = get_sharder("size_greedy").shard(task, MODEL)
    device, hbm = check_plan(plan, task)
    assert list(hbm) == [833, 500, 333]
    assert device[1] == device[2] != device[0]
    report = evaluate(plan, task, MODEL)
    # Uniform access: A sends 167/1000 of its 2000 lookups to host memory, C 167/500 of 1000.
    assert report.uvm_lookup_share == pytest.approx((2000 * 167 / 1000 + 1000 * 167 / 500) / 4000)


@pytest.mark.parametrize("name", BASELINES)
def test_a_table_larger_than_any_device_is_a_capacity_error(name: str) -> None:
    big = Table("big", rows=10**6, dim=8)  # 36 MB in train mode
    task = ShardingTask((*hand_tables(), big), hand_profile(host_bytes=10**6),
                        Workload(batch_size=1000))
    with pytest.raises(PlannerError, match="'big' needs") as info:
        get_sharder(name).shard(task, MODEL)
    assert info.value.kind == "capacity"


def test_random_is_deterministic_for_a_seed() -> None:
    tables = tuple(Table(f"t{i}", rows=100 + 37 * i, dim=8) for i in range(20))
    task = ShardingTask(tables, hand_profile(devices=4, hbm_bytes=50_000),
                        Workload(batch_size=100))
    plans = [get_sharder("random", seed=s).shard(task, MODEL) for s in (7, 7, 8)]
    assert plans[0] == plans[1]
    assert plans[0].placements != plans[2].placements


@st.composite
def tasks(draw: st.DrawFn) -> ShardingTask:
    """Small random tasks: 1-8 devices, random tables, capacities from scarce to ample."""
    count = draw(st.integers(1, 10))
    tables = []
    for i in range(count):
        skew = draw(st.one_of(st.none(), st.floats(0.0, 2.0)))
        tables.append(Table(f"t{i}", rows=draw(st.integers(1, 5000)),
                            dim=draw(st.sampled_from([4, 8, 16, 64])),
                            bytes_per_element=draw(st.sampled_from([2, 4])),
                            pooling_factor=draw(st.floats(0.1, 30.0)),
                            coverage=draw(st.floats(0.05, 1.0)), zipf_alpha=skew))
    mode = draw(st.sampled_from(["train", "infer"]))
    workload = Workload(batch_size=draw(st.integers(1, 4096)), mode=mode)
    need = sum(t.rows * t.memory_bytes_per_row(workload.train) for t in tables)
    devices = draw(st.integers(1, 8))
    hbm = int(need * draw(st.floats(0.0, 1.5)) / devices)
    host = int(need * draw(st.floats(0.0, 1.5)))  # from 1.0 on, each device holds all tables
    return ShardingTask(tuple(tables), hand_profile(devices, hbm_bytes=hbm, host_bytes=host),
                        workload)


def check_sharder_on(name: str, task: ShardingTask) -> None:
    """A plan that validates, stays within every capacity and costs no less than the bound; or
    a capacity error only when the task cannot fit."""
    a, dev = task.table_arrays, task.device_arrays
    need = a.rows * a.memory_bytes_per_row
    try:
        plan = get_sharder(name, **common_options(name, {"seed": 1})).shard(task, MODEL)
    except PlannerError as exc:
        assert exc.kind == "capacity"
        # Host memory on every device that holds all tables together makes any table fit.
        assert dev.host_capacity.min() < need.sum(), f"{name} failed with ample host memory"
        return
    assert need.sum() <= (dev.hbm_capacity + dev.host_capacity).sum()
    used_hbm, used_host = shard_memory(task, check_layout(plan, task))  # splits included
    assert (used_hbm <= dev.hbm_capacity).all() and (used_host <= dev.host_capacity).all()
    report = evaluate(plan, task, MODEL)
    assert report.step_cost_ms >= report.lower_bound_ms * (1 - 1e-9)
    assert report.step_cost_ms == pytest.approx(max(d.total_ms for d in report.per_device))


@pytest.mark.parametrize("name", BASELINES)
@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(task=tasks())
def test_baselines_on_random_tasks(name: str, task: ShardingTask) -> None:
    check_sharder_on(name, task)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(task=tasks())
def test_capacity_error_when_the_tables_exceed_all_memory(task: ShardingTask) -> None:
    a, dev = task.table_arrays, task.device_arrays
    if (a.rows * a.memory_bytes_per_row).sum() <= (dev.hbm_capacity + dev.host_capacity).sum():
        return
    for name in BASELINES:
        with pytest.raises(PlannerError) as info:
            get_sharder(name).shard(task, MODEL)
        assert info.value.kind == "capacity"


@pytest.mark.parametrize("name", sharder_names())
def test_every_registered_sharder_on_a_tiny_task(name: str) -> None:
    reason = sharder_info(name).unavailable
    if reason:
        pytest.skip(f"{name} unavailable here: {reason}")
    tables = (*hand_tables(), Table("D", rows=2000, dim=4, zipf_alpha=1.0))
    task = ShardingTask(tables, hand_profile(devices=2, hbm_bytes=60_000),
                        Workload(batch_size=512))
    check_sharder_on(name, task)


def test_greedy_keys_follow_their_definitions() -> None:
    from autoshard.sharders.greedy import DimGreedy, LookupGreedy, SizeGreedy, SizeLookupGreedy

    t = (Table("x", rows=1000, dim=16, pooling_factor=4.0, coverage=0.5),
         Table("y", rows=10, dim=8, bytes_per_element=2))
    task = ShardingTask(t, hand_profile(), Workload(batch_size=8))
    assert list(SizeGreedy().keys(task)) == [1000 * 16 * 4, 10 * 8 * 2]
    assert list(DimGreedy().keys(task)) == [16, 8]
    assert list(LookupGreedy().keys(task)) == [16 * 4 * 0.5, 8]
    assert np.allclose(SizeLookupGreedy().keys(task), [16 * 2 * 3, 8 * 1])


def test_placement_state_bookkeeping(hand_task: ShardingTask) -> None:
    from autoshard.layout.placement import PlacementState

    state = PlacementState(hand_task, MODEL)
    assert list(state.max_hbm_rows(0)) == [1000, 1000]  # 36,000 B / 36 B per row, exactly
    assert state.full_fit(0).all()
    price = state.place(0, 0, 1000)
    assert price == pytest.approx(sum(reference_price_ms(hand_tables()[0], 1.0, 2)))
    assert list(state.free_hbm) == [0.0, 36_000.0]
    assert list(state.load_ms) == [pytest.approx(price), 0.0]
    # B fits whole only on device 1; exactly filling a tier still fits.
    assert list(state.full_fit(1)) == [False, True]
    assert list(state.fits(1, np.array([0, 500]))) == [True, True]
    state.place(1, 1, 500)
    state.place(2, 1, 500)
    assert list(state.free_hbm) == [0.0, 0.0]
    with pytest.raises(AssertionError):
        state.place(2, 0, 0)
    plan = state.to_plan("manual")
    assert check_plan(plan, hand_task)[0].tolist() == [0, 1, 1]


def test_best_split_prefers_most_free_hbm_then_least_load() -> None:
    from autoshard.layout.placement import PlacementState

    task = ShardingTask(hand_tables(), hand_profile(devices=3, hbm_bytes=20_000),
                        Workload(batch_size=1000))
    state = PlacementState(task, MODEL)
    state.place(1, 0, 100)  # device 0 keeps 16,400 B of HBM free
    device, rows = state.best_split(0)
    assert (device, rows) == (1, 555)  # devices 1 and 2 tie on 20,000 B; 1 comes first
    state.place(0, device, rows)
    assert state.best_split(2) == (2, 500)


def test_split_greedy_variant_splits_only_tables_above_the_device_mean() -> None:
    from autoshard.layout.shards import check_layout
    from autoshard.pricing.bounds import lower_bound_ms
    from autoshard.tables import Table
    from autoshard.workloads import constrained_task, dlrm_tables

    tables = (*dlrm_tables(10, seed=3),
              Table("huge", rows=2_000_000, dim=128, pooling_factor=100.0, zipf_alpha=1.05))
    task = constrained_task(tables, 4, hbm_fraction=0.3)
    plain = get_sharder("lookup_greedy").shard(task, MODEL)
    split = get_sharder("split_lookup_greedy").shard(task, MODEL)
    assert not plain.is_split and get_sharder("lookup_greedy", split=True).shard(
        task, MODEL) == split.__class__(split.placements, "lookup_greedy", split.workload,
                                        split.hardware)
    assert [p.table for p in split.placements if p.is_split] == ["huge"]
    check_layout(split, task)
    cost = evaluate(split, task, MODEL).step_cost_ms
    assert cost < 0.8 * evaluate(plain, task, MODEL).step_cost_ms
    assert cost >= lower_bound_ms(task, MODEL)

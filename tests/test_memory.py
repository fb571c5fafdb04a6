"""HBM as TorchRec counts it: our reservation bounds TorchRec's storage estimate, and every
registered sharder's plans on the small suites fit it per rank as exported, with no cache
lowered at export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from clocks import StepClock

from autoshard.compare.suites import get_suite
from autoshard.errors import PlannerError
from autoshard.layout.placement import PlacementState
from autoshard.layout.plan import Placement, Plan, Shard, hbm_use
from autoshard.layout.shards import ShardLayout, plan_layout, pricing_task
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.evaluator import evaluate
from autoshard.reservation import NO_RESERVATION
from autoshard.sharders import get_sharder, sharder_info, sharder_names
from autoshard.task import ShardingTask
from autoshard.torchrec import torchrec_unavailable
from autoshard.torchrec.shardings import table_shardings
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()
needs_torchrec = pytest.mark.skipif(
    torchrec_unavailable(load=True) is not None,
    reason=f"torchrec not importable: {torchrec_unavailable(load=True)}")
#: Short limits for the slow sharders; the fit must not depend on how long they search (each
#: returns a plan however early its limit comes). TorchRec's planner can find none when cut
#: before it proposes, so its limit is kept on a step clock, 0.2 s a reading.
OPTIONS = {"recshard": {"time_limit": 1.0}, "torchrec": {"time_limit": 5.0},
           "ppo": {"time_limit": 1.0}, "ppo-policy": {"time_limit": 1.0}}


def _planned_use(plan: Plan, task: ShardingTask) -> np.ndarray:
    layout = plan_layout(plan, task)
    return hbm_use(pricing_task(task, layout.geometry), layout.device, layout.hbm_rows)


def test_reservation_is_torchrecs_buffers_and_cache_state_in_train_only() -> None:
    train = constrained_task(dlrm_tables(4, seed=1), 2, reservation="torchrec")
    a = train.table_arrays
    t = train.tables[0]
    batch = train.workload.batch_size
    # I/O buffers: 8 bytes per input id, 4 per pooled output element, over the global batch;
    # 4 bytes of cache index per row; one row and 64 bytes of rounding slack.
    io = np.ceil(t.lookups_per_sample * batch * 8) + np.ceil(min(1.0, t.lookups_per_sample)
                                                             * batch * t.dim * 4)
    per_row = t.row_bytes + max(t.optimizer_bytes_per_row, t.bytes_per_element) + 16
    assert a.hbm_bytes_per_row[0] == per_row
    assert a.hbm_reserved_bytes[0] == io + 4 * t.rows + per_row + 64
    plain = constrained_task(dlrm_tables(4, seed=1), 2)
    assert (plain.table_arrays.hbm_reserved_bytes == 0).all()
    assert (plain.table_arrays.hbm_bytes_per_row == plain.table_arrays.memory_bytes_per_row).all()
    infer = constrained_task(dlrm_tables(4, seed=1), 2, mode="infer", reservation="torchrec")
    assert (infer.table_arrays.hbm_bytes_per_row == infer.table_arrays.row_bytes).all()
    assert (infer.table_arrays.hbm_reserved_bytes == infer.table_arrays.row_bytes + 64).all()


def test_the_prefetch_pipeline_reserves_ten_input_buffers_and_no_output() -> None:
    base = constrained_task(dlrm_tables(4, seed=1), 2, reservation="torchrec")
    ahead = constrained_task(dlrm_tables(4, seed=1), 2, reservation="torchrec-prefetch")
    t = base.tables[0]
    batch = base.workload.batch_size
    ids = np.ceil(t.lookups_per_sample * batch * 8)
    out = np.ceil(min(1.0, t.lookups_per_sample) * batch * t.dim * 4)
    # Three input buffers, seven prefetch buffers (as if cached), no output buffer; the rest
    # (cache index, a row, rounding) as in TorchRec's default pipeline.
    assert ahead.table_arrays.hbm_reserved_bytes[0] == (
        base.table_arrays.hbm_reserved_bytes[0] - ids - out + 10 * ids)
    assert (ahead.table_arrays.hbm_bytes_per_row == base.table_arrays.hbm_bytes_per_row).all()
    infer = constrained_task(dlrm_tables(4, seed=1), 2, mode="infer",
                             reservation="torchrec-prefetch")
    assert (infer.table_arrays.hbm_reserved_bytes == infer.table_arrays.row_bytes + 64).all()


def test_a_row_shard_reserves_a_worlds_share_of_the_ids_and_the_full_output() -> None:
    task = constrained_task(dlrm_tables(3, seed=2), 4, reservation="torchrec")
    t = task.tables[0]
    shards = tuple(Shard(d, d * t.rows // 4, (d + 1) * t.rows // 4, 0, t.dim, 0)
                   for d in range(4))
    plan = Plan((Placement.split(t.name, "row_wise", shards),
                 *(Placement(x.name, 0, 0) for x in task.tables[1:])))
    layout = plan_layout(plan, task)
    sub = pricing_task(task, layout.geometry)
    whole = task.table_arrays.hbm_reserved_bytes[0]
    row = sub.table_arrays.hbm_reserved_bytes[:4]
    batch = task.workload.batch_size
    ids = t.lookups_per_sample * batch * 8
    # Each row shard: a quarter of the ids, the whole pooled output, its own rows' index.
    assert row == pytest.approx(whole - ids + np.ceil(ids / 4) - 4 * t.rows + 4 * layout.geometry
                                .rows[:4], abs=4)


def test_placement_keeps_room_for_the_reservations_of_tables_still_to_place() -> None:
    task = constrained_task(dlrm_tables(12, seed=3), 2, hbm_fraction=0.3, reservation="torchrec")
    state = PlacementState(task, MODEL)
    a = task.table_arrays
    rest = a.hbm_reserved_bytes[1:].sum()
    # Rows of the first table leave every device its share of the others' reservations.
    assert (state.kept_back(0) >= rest * task.device_arrays.hbm_capacity
            / task.device_arrays.hbm_capacity.sum() - 1e-6).all()
    k = state.max_hbm_rows(0)
    assert (a.hbm_bytes(0, k) + state.kept_back(0) <= task.device_arrays.hbm_capacity).all()
    assert (state.fits(0, np.zeros(2, dtype=np.int64))).all()  # the reservation alone fits


def test_make_room_moves_hbm_rows_to_host_memory_and_reprices() -> None:
    task = constrained_task(dlrm_tables(3, seed=4), 1, hbm_fraction=0.3, reservation="torchrec")
    state = PlacementState(task, MODEL)
    a = task.table_arrays
    big = int(np.argmax(a.rows * a.memory_bytes_per_row))
    other = (big + 1) % 3
    # Fill the device's HBM with the biggest table's rows, ignoring what the others reserve.
    rows = int(a.hbm_rows_within(big, task.device_arrays.hbm_capacity)[0])
    assert 0 < rows < a.rows[big]
    state.place(big, 0, rows)
    before = state.load_ms[0]
    assert not state.fits(other, np.zeros(1, dtype=np.int64)).any()
    assert state.make_room(other) == 0
    assert state.free_hbm[0] >= a.hbm_reserved_bytes[other] - 1e-6
    assert state.hbm_rows[big] < rows and state.load_ms[0] > before
    assert state.price_ms[big] == pytest.approx(float(MODEL.price(
        task, np.array([big]), np.array([0]), np.array([state.hbm_rows[big]])).total_ms[0]))
    assert state.fits(other, np.zeros(1, dtype=np.int64)).all()


def test_a_table_whose_reservation_fits_no_device_is_a_capacity_error() -> None:
    task = constrained_task(dlrm_tables(6, seed=1), 2, hbm_fraction=0.001, reservation="torchrec")
    with pytest.raises(PlannerError, match="of HBM reserved for it"):
        get_sharder("lookup_greedy").shard(task, MODEL)


def test_split_tables_keep_one_hbm_share_without_overfilling() -> None:
    task = constrained_task(dlrm_tables(4, seed=5), 2, hbm_fraction=0.3, reservation="torchrec")
    t = task.tables[0]
    half = t.dim // 2
    plan = Plan((Placement.split(t.name, "column_wise", (
        Shard(0, 0, t.rows, 0, half, t.rows // 2), Shard(1, 0, t.rows, half, t.dim, 0))),
        *(Placement(x.name, 1, 0) for x in task.tables[1:])))
    layout = plan_layout(plan, task)
    even = layout.even_shares(task)
    shares = even.hbm_rows[:2] / layout.geometry.rows[:2]
    assert shares[0] == shares[1] and 0 < shares[0] < 0.5  # the mean, as device 1 has room
    use = hbm_use(pricing_task(task, layout.geometry), even.device, even.hbm_rows)
    assert (use <= task.device_arrays.hbm_capacity).all()
    assert ShardLayout(layout.geometry, even.device, even.hbm_rows).even_shares(
        task).hbm_rows.tolist() == even.hbm_rows.tolist()


@needs_torchrec
@pytest.mark.parametrize(("mode", "overhead"), [("train", "torchrec"), ("infer", "torchrec"),
                                                ("train", "torchrec-prefetch")])
def test_our_count_is_at_least_torchrecs_on_every_rank(mode: str, overhead: str) -> None:
    from autoshard.torchrec.estimate import estimate_plan

    # TorchRec's estimate is for the pipeline the overhead names (estimate_plan reads it).
    task = constrained_task(dlrm_tables(10, seed=6), 2, hbm_fraction=0.3, mode=mode,
                            reservation=overhead)
    for name in ("random", "lookup_greedy", "split_lookup_greedy"):
        plan = get_sharder(name).shard(task, MODEL)
        theirs = np.array([r.hbm_bytes for r in estimate_plan(plan, task).per_rank])
        ours = _planned_use(plan, task)
        assert (theirs <= ours).all() and (ours <= task.device_arrays.hbm_capacity).all(), name


def _available() -> list[str]:
    return [n for n in sharder_names() if sharder_info(n).unavailable is None]


@pytest.mark.slow
@needs_torchrec
@pytest.mark.parametrize("suite", ["tiny", "constrained-50x4"])
def test_every_sharders_plan_fits_torchrecs_storage_estimate_as_exported(suite: str) -> None:
    from autoshard.torchrec.estimate import estimate_shardings
    from autoshard.torchrec.storage import fit_shardings

    for spec in get_suite(suite):
        task = spec.build()
        assert task.reservation.name == "torchrec"
        for name in _available():
            sharder = get_sharder(name, **OPTIONS.get(name, {}))
            if name == "torchrec":
                sharder.clock = StepClock(0.2)  # type: ignore[attr-defined]
            plan = sharder.shard(task, MODEL)
            shardings = table_shardings(plan, task)
            estimate = estimate_shardings(shardings, task)  # TorchRec's own estimator
            fill = max(r.hbm_bytes / r.hbm_capacity for r in estimate.per_rank)
            assert estimate.fits, f"{spec.name} {name}: fullest rank at {fill:.4f} of its HBM"
            _, changed = fit_shardings(shardings, task)
            assert changed == [], f"{spec.name} {name}: export would lower {changed}"
            assert evaluate(plan, task, MODEL).step_cost_ms >= evaluate(
                plan, task, MODEL).lower_bound_ms * (1 - 1e-9)


def test_even_shares_counts_every_shard_of_a_table_on_one_device() -> None:
    task = constrained_task(dlrm_tables(4, seed=5), 2, hbm_fraction=0.3, reservation="torchrec")
    t = task.tables[0]
    q = t.dim // 4
    sub_rows = t.rows // 8
    blocks = tuple(Shard(d, 0, t.rows, i * q, (i + 1) * q, r) for i, (d, r) in enumerate(
        [(0, t.rows), (1, 0), (1, 0), (1, sub_rows)]))
    plan = Plan((Placement.split(t.name, "column_wise", blocks),
                 *(Placement(x.name, 0, 0) for x in task.tables[1:])))
    layout = plan_layout(plan, task)
    priced = pricing_task(task, layout.geometry)
    cap = task.device_arrays.hbm_capacity
    free = cap - hbm_use(priced, layout.device, layout.hbm_rows)
    # Device 1 holds three of the blocks: raising all three to the mean needs three times the
    # room of one; the even layout stays within every device's HBM.
    even = layout.even_shares(task)
    assert len(set((even.hbm_rows[:4] / layout.geometry.rows[:4]).tolist())) == 1
    assert (hbm_use(priced, even.device, even.hbm_rows) <= cap).all(), free


def test_plan_command_reserves_torchrecs_overhead_unless_told_not_to(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autoshard.cli import main
    from autoshard.tables import save_tables

    tables, plan = tmp_path / "t.json", tmp_path / "p.json"
    save_tables(tables, dlrm_tables(6, seed=1))
    args = ["-t", str(tables), "--devices", "2", "--hbm-gb", "0.05", "-s", "lookup_greedy",
            "-o", str(plan)]
    # 0.05 GB of HBM holds the weights of some rows, not TorchRec's buffers of every table.
    with pytest.raises(SystemExit) as failed:
        main(["plan", *args])
    assert failed.value.code != 0 and "of HBM reserved for it" in capsys.readouterr().err
    assert not plan.exists()
    main(["plan", *args, "--overhead", "none"])
    assert Plan.load(plan).placements
    with pytest.raises(SystemExit) as exc:
        main(["plan", *args, "--overhead", "some"])
    assert exc.value.code == 2


def test_the_lp_bound_of_evaluate_also_bounds_plans_made_without_the_room() -> None:

    from autoshard.sharders.recshard import recshard_bound

    task = constrained_task(dlrm_tables(8, seed=2), 2, hbm_fraction=0.3, reservation="torchrec")
    roomless = task.with_reservation(NO_RESERVATION)
    plan = get_sharder("lookup_greedy").shard(roomless, MODEL)
    bound = recshard_bound(task, MODEL)
    assert bound == pytest.approx(recshard_bound(roomless, MODEL))
    assert evaluate(plan, task, MODEL).step_cost_ms >= bound * (1 - 1e-9)

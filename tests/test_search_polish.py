"""The ppo sharder's improvement stage: re-chosen HBM rows and moves off the most loaded device."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from autoshard.layout.plan import Plan
from autoshard.layout.shards import check_layout
from autoshard.policy.buckets import MULTIPLIERS, N_BUCKETS
from autoshard.policy.network import PlacementNet, save_policy
from autoshard.pricing.analytical import AnalyticalCostModel
from autoshard.pricing.bounds import lower_bound_ms
from autoshard.pricing.curves import Curves
from autoshard.pricing.evaluator import evaluate
from autoshard.search.move_search import Polisher
from autoshard.search.polish import polish_plan
from autoshard.search.waterfill import SegmentLists
from autoshard.sharders import get_sharder
from autoshard.sharders.ppo import PPOSharder, tuning
from autoshard.task import ShardingTask
from autoshard.workloads import constrained_task, dlrm_tables

MODEL = AnalyticalCostModel()


@pytest.mark.parametrize(("count", "devices", "fraction", "sharder"), [
    (40, 4, 0.3, "random"), (40, 4, 0.3, "size_greedy"), (60, 8, 0.2, "round_robin"),
    (30, 8, 0.5, "split_lookup_greedy"), (25, 3, 0.05, "lookup_greedy")])
def test_never_worse_than_its_input_and_within_every_capacity(
        count: int, devices: int, fraction: float, sharder: str) -> None:
    task = constrained_task(dlrm_tables(count, seed=count + devices), devices, fraction)
    plan = get_sharder(sharder).shard(task, MODEL)
    before = evaluate(plan, task, MODEL).step_cost_ms
    out, cost = polish_plan(plan, task, MODEL)
    check_layout(out, task)  # every shard within its table, every device within capacity
    after = evaluate(out, task, MODEL).step_cost_ms
    assert cost == pytest.approx(after, rel=1e-9)
    assert after <= before
    assert after >= lower_bound_ms(task, MODEL) * (1 - 1e-9)
    if sharder in ("random", "round_robin"):  # plans that ignore costs: far from the best
        assert after < 0.9 * before


@pytest.mark.parametrize("sharder", ["random", "lookup_greedy", "split_lookup_greedy"])
def test_keeps_room_for_torchrecs_reservations(sharder: str) -> None:
    # With TorchRec's per-table HBM reserved, the re-chosen rows and moves still fit as the
    # runtime counts HBM (rows at its bytes per row, each item's reservation on its device),
    # and still improve plans that ignore costs.
    task = constrained_task(dlrm_tables(60, seed=5), 4, 0.3, reservation="torchrec")
    assert task.table_arrays.hbm_reserved_bytes.min() > 0
    plan = get_sharder(sharder).shard(task, MODEL)
    before = evaluate(plan, task, MODEL).step_cost_ms
    out, cost = polish_plan(plan, task, MODEL)
    check_layout(out, task)
    assert cost == pytest.approx(evaluate(out, task, MODEL).step_cost_ms, rel=1e-9)
    assert cost < (0.9 if sharder == "random" else 1.0) * before


def test_returns_its_input_when_nothing_improves() -> None:
    task = constrained_task(dlrm_tables(1, seed=2), 1, hbm_fraction=0.5)
    plan = get_sharder("size_greedy").shard(task, MODEL)  # one table on one device
    best, _ = polish_plan(plan, task, MODEL)
    out, cost = polish_plan(best, task, MODEL)
    assert out is best and cost == evaluate(best, task, MODEL).step_cost_ms


def test_moves_tables_off_an_overloaded_device() -> None:
    table = dlrm_tables(1, seed=3)[0]
    copies = [replace(table, name=f"copy{i}") for i in range(4)]
    task = constrained_task(copies, 2, hbm_fraction=2.0)  # every row fits in HBM
    crowded = Plan.from_arrays(task, np.zeros(4, dtype=np.int64),
                               task.table_arrays.rows.copy(), "crowded")
    before = evaluate(crowded, task, MODEL).step_cost_ms
    out, cost = polish_plan(crowded, task, MODEL)
    device, _ = out.arrays(task)
    assert np.bincount(device, minlength=2).tolist() == [2, 2]
    assert cost == pytest.approx(before / 2, rel=1e-6)  # four equal tables, two on each


def test_refill_gives_a_device_hbm_to_the_rows_worth_most() -> None:
    task = constrained_task(dlrm_tables(12, seed=5), 1, hbm_fraction=0.2)
    n = task.num_tables
    cold = Plan.from_arrays(task, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                            "cold")  # HBM left empty
    polisher = Polisher(task, MODEL, Curves.price(task, MODEL), *cold.arrays(task))
    before = polisher.load.copy()
    polisher.refill()
    per_row = task.table_arrays.memory_bytes_per_row
    used = float((polisher.rows * per_row).sum())
    assert used <= task.device_arrays.hbm_capacity[0]
    assert used >= 0.99 * task.device_arrays.hbm_capacity[0]  # HBM is worth filling
    assert polisher.load[0] < before[0]
    # No other split of the same HBM among the tables does better: moving a few rows'
    # bytes from any table to any other costs at least as much.
    rows = polisher.rows
    base = float(MODEL.price(task, np.arange(n), np.zeros(n, dtype=np.int64),
                             rows).total_ms.sum())
    for src in range(n):
        for dst in range(n):
            take = int(min(rows[src], np.ceil(rows[src] * 0.05)))
            give = int(np.floor(take * per_row[src] / per_row[dst]))
            if src == dst or take == 0 or rows[dst] + give > task.table_arrays.rows[dst]:
                continue
            other = rows.copy()
            other[src] -= take
            other[dst] += give
            cost = float(MODEL.price(task, np.arange(n), np.zeros(n, dtype=np.int64),
                                     other).total_ms.sum())
            assert cost >= base * (1 - 1e-6), (src, dst)


@pytest.mark.slow
def test_the_sharder_reports_the_polished_winner_and_the_policy_alone_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuning, "MIN_RESOLVE_S", float("inf"))  # the polish, not the LNS
    torch.manual_seed(0)
    save_policy(PlacementNet(N_BUCKETS, hidden=16), tmp_path / "policy", MULTIPLIERS)
    task = constrained_task(dlrm_tables(40, seed=9), 4, hbm_fraction=0.3)
    polished = PPOSharder(policy=tmp_path / "policy", samples=1).solve(task, MODEL)
    plain = PPOSharder(policy=tmp_path / "policy", samples=1, polish=False).solve(task, MODEL)
    cost = evaluate(polished.plan, task, MODEL).step_cost_ms
    raw = evaluate(plain.plan, task, MODEL).step_cost_ms
    assert cost <= raw
    assert not any(n.endswith("+polish") for n in plain.details.costs)
    if cost < raw:  # a candidate of the plain run, polished (then maybe re-split, kicked),
        # maybe re-solved by groups of devices last
        winner = polished.details.winner
        base, *steps = winner.split("+")
        assert "lns" not in steps[:-1]
        searched = [s for s in steps if s != "lns"]
        assert not searched or (searched[0] == "polish"
                                and set(searched[1:]) <= {"resplit", "kick"})
        assert base in plain.details.costs
        assert polished.details.costs[winner] == pytest.approx(cost, rel=1e-9)
        if searched:
            assert polished.details.costs[f"{base}+polish"] < plain.details.costs[base]
    alone = PPOSharder(policy=tmp_path / "policy", samples=0, candidates=False,
                       polish=False).solve(task, MODEL).details
    assert "ppo-greedy" in alone.costs
    assert not any(n.endswith("+polish") for n in alone.costs)


@pytest.mark.slow
def test_few_tables_per_device_get_a_finer_split(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tuning, "MIN_RESOLVE_S", float("inf"))  # the decodes, not the LNS
    torch.manual_seed(0)
    save_policy(PlacementNet(N_BUCKETS, hidden=16), tmp_path / "policy", MULTIPLIERS)
    task = constrained_task(dlrm_tables(10, seed=11), 8, hbm_fraction=0.3)
    polished = PPOSharder(policy=tmp_path / "policy").solve(task, MODEL)
    check_layout(polished.plan, task)
    assert "ppo-fine-greedy" in polished.details.costs
    plain = PPOSharder(policy=tmp_path / "policy", polish=False)
    # Without the polish too: with each decode's HBM water-filled, the finer pieces can win.
    assert "ppo-fine-greedy" in plain.solve(task, MODEL).details.costs
    other = constrained_task(dlrm_tables(40, seed=11), 8, hbm_fraction=0.3)  # 5 per device
    assert not any(n.startswith("ppo-fine") for n in plain.solve(other, MODEL).details.costs)


def _two_kinds(reservation: str) -> tuple[ShardingTask, Polisher]:
    """40 tables on 6 devices of two kinds (every other one with a third of the HBM), HBM
    reserved as ``reservation`` says, and a polisher of ``lookup_greedy``'s plan of them."""
    task = constrained_task(dlrm_tables(40, seed=13), 6, hbm_fraction=0.3,
                            reservation=reservation)
    hw = task.hardware
    small = [replace(d, hbm=replace(d.hbm, capacity_bytes=d.hbm.capacity_bytes // 3))
             if i % 2 else d for i, d in enumerate(hw.devices)]
    task = replace(task, hardware=replace(hw, devices=tuple(small)))
    return task, Polisher(task, MODEL, Curves.price(task, MODEL),
                          *get_sharder("lookup_greedy").shard(task, MODEL).arrays(task))


@pytest.mark.parametrize("reservation", ["none", "torchrec"])
def test_an_arrival_is_priced_at_the_items_best_grid_point(reservation: str) -> None:
    """The bisection over an arriving item's grid points, up to the last that the lower bound
    leaves (:meth:`Polisher._least`), finds what pricing every one finds: the device's load
    with the item's best split of its HBM; and the bound is at most what the item adds there
    (devices of two kinds, HBM reserved per table or not)."""
    task, polisher = _two_kinds(reservation)
    lists = SegmentLists.build(polisher.curves, polisher.device, polisher.hbm_cap)
    sel, devices = np.arange(task.num_tables), np.arange(task.num_devices)
    least, last = polisher._least(lists, sel, devices)
    item, dev = (a.ravel() for a in np.meshgrid(sel, devices, indexing="ij"))
    got = polisher._arrival(lists, item, dev, last.ravel()).reshape(least.shape)
    cut = 0  # pairs whose bisection the bound's last grid point narrowed
    for i in sel:
        for d in devices:
            k = polisher.kind[d]
            room = polisher.hbm_cap[d] - polisher.reserved[i] - polisher.used[k, i]
            fits = room >= 0
            if not fits.any():
                assert got[i, d] == np.inf and least[i, d] == np.inf and last[i, d] == -1
                continue
            cost = polisher.cost[k, i]
            every = (cost[0] - cost[fits]) + lists.saving_at(np.full(fits.sum(), d), room[fits])
            assert got[i, d] == pytest.approx(lists.base[d] + cost[0] - every.max(), rel=1e-12)
            assert least[i, d] <= got[i, d] - lists.load[d] + 1e-9 * abs(got[i, d])
            cut += int(last[i, d] < fits.sum() - 1)
    assert cut > 0  # the bound narrowed some bisections, and they still found the best point


@pytest.mark.parametrize("reservation", ["none", "torchrec"])
def test_the_bound_drops_no_change_the_search_would_apply(reservation: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """The search with changes dropped by :meth:`Polisher._least` ends where it ends with every
    change estimated (a bound that drops none: minus infinity, every grid point that fits),
    move for move (devices of two kinds, HBM reserved per table or not)."""
    task, _ = _two_kinds(reservation)
    start = get_sharder("lookup_greedy").shard(task, MODEL).arrays(task)
    curves = Curves.price(task, MODEL)
    pruned = Polisher(task, MODEL, curves, *start)
    pruned.search(200, 60.0)

    def nothing_dropped(self: Polisher, lists: SegmentLists, sel: np.ndarray,
                        devices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cap = self.hbm_cap[devices][None, :] - self.reserved[sel][:, None]
        used = self.used[self.kind[devices][None, :], sel[:, None]]  # [n, D', G]
        last = (used <= cap[:, :, None]).sum(axis=2) - 1
        return np.where(last >= 0, -np.inf, np.inf), last

    monkeypatch.setattr(Polisher, "_least", nothing_dropped)
    full = Polisher(task, MODEL, curves, *start)
    full.search(200, 60.0)
    assert np.array_equal(pruned.device, full.device)
    assert np.array_equal(pruned.rows, full.rows)
    assert not np.array_equal(full.device, start[0])  # the search moved items


def test_segments_by_item_are_those_a_scan_finds() -> None:
    """The curves' index of each item's segments gives, for a device, the segments a scan of
    every segment finds, in water-filling order."""
    task, polisher = _two_kinds("torchrec")
    curves, device = polisher.curves, polisher.device
    for d in range(task.num_devices):
        owner = curves.segments[curves.kind[d]][0]
        assert np.array_equal(curves.on_device(device, d), np.flatnonzero(device[owner] == d))


@pytest.mark.parametrize("reservation", ["none", "torchrec"])
def test_the_segment_lists_after_a_move_are_those_a_whole_build_makes(reservation: str) -> None:
    """After items change devices, laying out only the two devices' segments again gives the
    lists a whole build gives (devices of two kinds; moves, swaps, a device emptied)."""
    task, polisher = _two_kinds(reservation)
    device = polisher.device.copy()
    lists = SegmentLists.build(polisher.curves, device, polisher._caps(device))
    rng = np.random.default_rng(3)
    for step in range(30):
        i, j = rng.choice(task.num_tables, 2, replace=False)
        a, b = int(device[i]), int(rng.integers(task.num_devices))
        if step == 29:  # every item of one device leaves it
            b = (a + 1) % task.num_devices
            device[device == a] = b
        elif step % 3 == 0:  # a swap
            b = int(device[j])
            device[i], device[j] = b, a
        else:
            device[i] = b
        caps = polisher._caps(device)
        lists = lists.moved(polisher.curves, device, caps, np.array([a, b]))
        whole = SegmentLists.build(polisher.curves, device, caps)
        for name in ("start", "end", "owner", "extra", "worth", "saving", "base"):
            np.testing.assert_array_equal(getattr(lists, name), getattr(whole, name))
        for name in ("bytes_in", "saved_in", "load"):
            np.testing.assert_allclose(getattr(lists, name), getattr(whole, name), rtol=1e-12)
        dev = np.repeat(np.arange(task.num_devices), 50)
        budget = rng.uniform(0, 1.2, dev.size) * caps.max()
        np.testing.assert_allclose(lists.saving_at(dev, budget), whole.saving_at(dev, budget),
                                   rtol=1e-12)


def test_devices_of_several_kinds() -> None:
    task = constrained_task(dlrm_tables(40, seed=13), 4, hbm_fraction=0.3)
    hw = task.hardware
    small = [replace(d, hbm=replace(d.hbm, capacity_bytes=d.hbm.capacity_bytes // 3))
             if i % 2 else d for i, d in enumerate(hw.devices)]
    mixed = replace(task, hardware=replace(hw, devices=tuple(small)))
    curves = Curves.price(mixed, MODEL)
    assert curves.cost.shape[0] == 2  # two kinds of device, a curve set each
    plan = get_sharder("random").shard(mixed, MODEL)
    before = evaluate(plan, mixed, MODEL).step_cost_ms
    out, cost = polish_plan(plan, mixed, MODEL)
    check_layout(out, mixed)
    assert cost == pytest.approx(evaluate(out, mixed, MODEL).step_cost_ms, rel=1e-9)
    assert cost < 0.9 * before


def test_split_tables_keep_one_share_and_the_hbm_it_frees_goes_to_the_others() -> None:
    # On a task planned for TorchRec a split table's shards keep one HBM share (its one cache
    # load factor); the stage fills the rest of each device's HBM around them.
    task = constrained_task(dlrm_tables(30, seed=38), 8, 0.3, reservation="torchrec")
    plan = get_sharder("split_lookup_greedy").shard(task, MODEL)
    assert plan.is_split
    out, cost = polish_plan(plan, task, MODEL)
    check_layout(out, task)
    assert cost <= evaluate(plan, task, MODEL).step_cost_ms
    for p in out.placements:
        if p.is_split:
            shares = {s.hbm_rows / (s.row_end - s.row_start) for s in p.shards}
            assert max(shares) - min(shares) < 1e-3, p.table
    # Locked items keep their rows; the others are water-filled into what is left.
    from autoshard.layout.shards import plan_layout, pricing_task

    layout = plan_layout(out, task)
    items = pricing_task(task, layout.geometry)
    locked = layout.geometry.parts > 1
    polisher = Polisher(items, MODEL, Curves.price(items, MODEL), layout.device,
                        np.where(locked, layout.hbm_rows, 0), locked=locked)
    polisher.refill()
    assert (polisher.rows[locked] == layout.hbm_rows[locked]).all()
    used = np.bincount(polisher.device, weights=polisher.rows * items.table_arrays.
                       hbm_bytes_per_row + items.table_arrays.hbm_reserved_bytes,
                       minlength=task.num_devices)
    assert (used <= task.device_arrays.hbm_capacity + 1).all()


def test_fill_only_moves_nothing_and_is_never_below_the_full_stage() -> None:
    task = constrained_task(dlrm_tables(40, seed=7), 4, 0.3, reservation="torchrec")
    plan = get_sharder("random").shard(task, MODEL)
    filled, quick = polish_plan(plan, task, MODEL, fill_only=True)
    assert filled.arrays(task)[0].tolist() == plan.arrays(task)[0].tolist()
    assert quick == pytest.approx(evaluate(filled, task, MODEL).step_cost_ms, rel=1e-9)
    _, full = polish_plan(plan, task, MODEL)
    assert full <= quick < evaluate(plan, task, MODEL).step_cost_ms


def test_a_split_tables_share_is_chosen_again_where_that_lowers_the_step_cost() -> None:
    # The share each shard got on its own device, made one per table, is a starting point:
    # the stage tries others (the rest water-filled around them) and keeps a cheaper one.
    from autoshard.layout.shards import ShardLayout, plan_layout, pricing_task
    from autoshard.pricing.evaluator import step_cost_ms
    from autoshard.search.polish import _tune_shares

    task = constrained_task(dlrm_tables(30, seed=38), 8, 0.3, reservation="torchrec")
    plan, _ = polish_plan(get_sharder("split_lookup_greedy").shard(task, MODEL), task, MODEL)
    layout = plan_layout(plan, task)
    items = pricing_task(task, layout.geometry)
    split = layout.geometry.parts > 1
    # Start from a poor share: a tenth of the rows the stage chose for the split tables.
    rows = np.where(split, layout.hbm_rows // 10, layout.hbm_rows)
    low = Polisher(items, MODEL, Curves.price(items, MODEL), layout.device, rows, locked=split)
    low.refill()
    start = step_cost_ms(items, MODEL, layout.device, low.rows)
    tuned, cost = _tune_shares(items, MODEL, Curves.price(items, MODEL),
                               ShardLayout(layout.geometry, layout.device, low.rows), start)
    assert cost < start
    assert cost == pytest.approx(step_cost_ms(items, MODEL, tuned.device, tuned.hbm_rows))
    check_layout(tuned.to_plan(task), task)
    for t in np.unique(layout.geometry.table[split]):
        idx = layout.geometry.table == t
        shares = tuned.hbm_rows[idx] / layout.geometry.rows[idx]
        assert shares.max() - shares.min() < 1e-3


def test_the_steps_after_the_polish_get_a_time_guard_that_grows_with_the_task() -> None:
    from autoshard.search.polish import step_seconds

    assert step_seconds(10, 2) == pytest.approx(0.1)
    assert step_seconds(200, 8) < step_seconds(300, 16) < step_seconds(5000, 128)
    assert step_seconds(5000, 128) == pytest.approx(0.5)


@pytest.mark.parametrize(("seconds", "over_bound", "resplit", "kick"), [
    (10.0, 1.5, 2.5, 2.5),  # a gap of 0.5: GAP_SECONDS x 0.5 each, within its share
    (10.0, 6.0, 5.0, 10.0),  # a gap of 5: each step its share of what is left
    (10.0, 1.02, None, None),  # near the bound: each step's own guard
    (10.0, None, None, None),  # no bound given: the same
    (0.4, 1.5, 0.2, 0.4),  # little time left: the share, whatever the gap
])
def test_the_steps_after_the_polish_get_more_time_where_the_gap_to_the_bound_is_large(
        monkeypatch: pytest.MonkeyPatch, seconds: float, over_bound: float | None,
        resplit: float | None, kick: float | None) -> None:
    import autoshard.search.stage as stage

    guards: dict[str, float | None] = {}

    def step(name: str) -> object:
        def run(plan: Plan, task: object, cost_model: object, cost: float,
                seconds: float | None = None, **_: object) -> tuple[Plan, float]:
            guards[name] = seconds
            return plan, cost
        return run

    monkeypatch.setattr(stage, "resplit_plan", step("resplit"))
    monkeypatch.setattr(stage, "kick_plan", step("kick"))
    assert stage.GAP_SECONDS == 5.0
    task = constrained_task(dlrm_tables(20, seed=1), 2, hbm_fraction=0.3)
    plan = get_sharder("lookup_greedy").shard(task, MODEL)
    cost = 2.0
    stage.refine(plan, task, MODEL, cost, seconds=seconds,
                 bound_ms=None if over_bound is None else cost / over_bound)
    for name, want in (("resplit", resplit), ("kick", kick)):
        if want is None:
            assert guards[name] is None
        else:
            assert guards[name] == pytest.approx(want, rel=0.01)

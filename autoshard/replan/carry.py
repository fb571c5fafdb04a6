"""The plan in use carried onto a new task: the re-plan that moves only what it must.

Every table the plan in use holds keeps its pieces, devices and HBM rows where the new task
allows them (its rows and dim unchanged, its devices still there, its sharding kind allowed and
its split still valid on the new hardware: a replicated table needs a replica on every device).
The others are placed like new tables, whole, each costliest first on the device with the most
free HBM rows that holds it (:meth:`autoshard.layout.placement.PlacementState.best_split`).
Where the new task's HBM no longer holds the carried rows (its runtime reserves more per table
once the statistics grew), HBM rows are cut on the overfull devices
(:func:`autoshard.layout.feasibility.fit_hbm`) until they fit. What the carried plan copies
(those cuts, and the pieces of drained devices) is the re-plan's least move
(:attr:`autoshard.replan.budget.Moves.forced_bytes`).
"""

from __future__ import annotations

import numpy as np

from autoshard.errors import InputError, PlannerError, gib
from autoshard.hardware import HardwareProfile
from autoshard.layout.feasibility import feasible, fit_hbm
from autoshard.layout.placement import PlacementState
from autoshard.layout.plan import Placement, Plan, check_devices
from autoshard.layout.shards import ShardLayout, plan_layout, pricing_task
from autoshard.pricing.cost import CostModel
from autoshard.replan.budget import MoveBudget, Moves, slowest_gbps
from autoshard.replan.moves import Incumbent
from autoshard.tables import Table
from autoshard.task import ShardingTask


def carry(previous: Plan, task: ShardingTask, cost_model: CostModel, budget: MoveBudget,
          hardware: HardwareProfile | None = None, tables: tuple[Table, ...] | None = None
          ) -> Moves:
    """The budget resolved for re-planning ``task`` from ``previous`` (made on ``hardware``
    for ``tables``, by default those its context records), with the plan in use carried onto
    the task (module docstring).

    Raises:
        PlannerError: The carried plan does not fit the new task even with every HBM row
            cut (the device and the bytes named).
    """
    incumbent = Incumbent.of(previous, task, hardware, tables)
    layout, notes = carried_layout(previous, task, cost_model, incumbent)
    moves = Moves(task, incumbent, layout, budget, np.inf)
    forced = moves.copied(layout)
    total = float((task.table_arrays.rows * task.table_arrays.memory_bytes_per_row).sum())
    limit = budget.limit_bytes(total, slowest_gbps(task))
    if forced > limit:
        notes.append(f"the carried plan must copy {gib(forced)} (more than the budget's "
                     f"{gib(limit)}): the limit is raised to it")
    return Moves(task, incumbent, layout, budget, max(limit, forced), forced, tuple(notes))


def carried_layout(previous: Plan, task: ShardingTask, cost_model: CostModel,
                   incumbent: Incumbent) -> tuple[ShardLayout, list[str]]:
    """The carried plan as a layout of ``task``, and what the carry changed, one line each."""
    kept, orphans, notes = _kept_placements(previous, task, incumbent)
    placements = [*kept, *(Placement(task.tables[t].name, 0, 0) for t in orphans)]
    layout = plan_layout(Plan(tuple(placements)), task, "carried plan")
    g = layout.geometry
    items = pricing_task(task, g)
    a = items.table_arrays
    orphan = np.isin(g.table, orphans)
    device = np.where(orphan, -1, layout.device)
    rows = a.hbm_rows_allowed(slice(None), layout.hbm_rows)
    rows, cut = _fit(items, device, rows, ~orphan)
    if cut:
        notes.append(f"HBM rows cut to fit the new task on device(s) {', '.join(map(str, cut))}")
    state = PlacementState(items, cost_model)
    for i in np.flatnonzero(~orphan):
        state.place(int(i), int(device[i]), int(rows[i]))
    order = np.flatnonzero(orphan)
    cost = cost_model.price(items, order, np.zeros(order.size, dtype=np.int64),
                            np.zeros(order.size, dtype=np.int64)).total_ms
    for i in order[np.argsort(-cost, kind="stable")]:
        state.place(int(i), *state.best_split(int(i)))
    if not feasible(items, state.device, state.hbm_rows):
        raise PlannerError("capacity", "the plan in use does not fit the new task")
    return ShardLayout(g, state.device.copy(), state.hbm_rows.copy()), notes


def _kept_placements(previous: Plan, task: ShardingTask, incumbent: Incumbent
                     ) -> tuple[list[Placement], list[int], list[str]]:
    """The placements of ``previous`` the new task keeps, the task indices of the tables to
    place anew, and notes on them."""
    node = task.device_arrays.node
    by_name = {p.table: p for p in previous.placements}
    kept: list[Placement] = []
    orphans: list[int] = []
    moved: list[str] = []
    for t, table in enumerate(task.tables):
        p = by_name.get(table.name)
        if p is None or incumbent.created[t]:
            orphans.append(t)
            continue
        try:
            check_devices(p, p.pieces(table.rows, table.dim), table.name, None, node,
                          task.hardware.name)
            allowed = task.constraints.of(table.name).allows(p.sharding)
        except InputError:
            allowed = False
        if allowed:
            kept.append(p)
        else:
            orphans.append(t)
            moved.append(table.name)
    created = int(incumbent.created.sum())
    notes = [f"{created} table(s) new or re-sized: created, not moved"] if created else []
    if moved:
        notes.append(f"{len(moved)} table(s) placed anew, their placement no longer valid on "
                     f"the new task: {', '.join(moved[:5])}{'...' if len(moved) > 5 else ''}")
    if incumbent.removed:
        notes.append(f"{len(incumbent.removed)} table(s) of the plan in use dropped")
    return kept, orphans, notes


def _fit(items: ShardingTask, device: np.ndarray, rows: np.ndarray, placed: np.ndarray
         ) -> tuple[np.ndarray, list[int]]:
    """``rows`` with HBM rows cut on overfull devices until the placed items fit; and the
    devices cut.

    Raises:
        PlannerError: A device the placed items' reservations alone overfill.
    """
    a, cap = items.table_arrays, items.device_arrays.hbm_capacity
    on = np.where(placed, device, 0)

    def used(r: np.ndarray) -> np.ndarray:
        return np.bincount(on[placed], weights=a.hbm_bytes(placed, r[placed]),
                           minlength=cap.size)

    before = used(rows) > cap
    for _ in range(int(placed.sum()) + 1):
        if not (used(rows) > cap + 1e-6).any():
            return rows, [int(d) for d in np.flatnonzero(before)]
        cut = rows.copy()
        cut[placed] = fit_hbm(items.subset(np.flatnonzero(placed)), on[placed], rows[placed])
        if np.array_equal(cut, rows):
            break
        rows = cut
    d = int(np.argmax(used(rows) - cap))
    raise PlannerError("capacity", f"the plan in use overfills device {d}'s HBM on the new task "
                       f"by {gib(used(rows)[d] - cap[d])} with its HBM rows cut")


__all__ = ["carried_layout", "carry"]

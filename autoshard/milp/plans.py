"""Between the MILP and plans: subproblems of a task, row rounding, warm starts, bounds."""

from __future__ import annotations

import numpy as np

from autoshard.errors import PlannerError
from autoshard.layout.feasibility import feasible, fit_hbm
from autoshard.layout.placement import PlacementState
from autoshard.milp import model as milp_model
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import UNIT_BYTES, CostLines, DeviceKinds, hbm_terms
from autoshard.pricing.evaluator import device_totals, price_plan
from autoshard.task import ShardingTask


def aggregated(task: ShardingTask, kinds: DeviceKinds) -> milp_model.Subproblem:
    """The LP relaxation with one weighted "device" per kind standing for all devices of that
    kind. Averaging any plan's per-device solution over each kind gives a point of this LP with
    the same step cost, so its optimum is a lower bound on the max over devices."""
    dev = task.device_arrays
    weight = np.bincount(kinds.kind, minlength=kinds.count).astype(np.float64)
    reps = kinds.representative
    full = task.table_arrays.rows * task.table_arrays.memory_bytes_per_row / UNIT_BYTES
    scale, reserved = hbm_terms(task, np.arange(task.num_tables))
    return milp_model.Subproblem(np.arange(task.num_tables), np.arange(kinds.count),
                                 dev.hbm_capacity[reps] / UNIT_BYTES,
                                 dev.host_capacity[reps] / UNIT_BYTES, full, weight,
                                 integer=False, symmetric=False, hbm_scale=scale,
                                 reserved=reserved, least=least_memory(task))


def device_subproblem(task: ShardingTask, kinds: DeviceKinds, tables: np.ndarray,
                      devices: np.ndarray, fixed: np.ndarray | None = None,
                      pins: np.ndarray | None = None,
                      moves: milp_model.MoveTerms | None = None) -> milp_model.Subproblem:
    """The per-device MILP of ``tables`` on ``devices`` (``fixed``: device position per table,
    splits only, as an LP; ``pins``: a device per task table, -1 where free, e.g. the shards of
    a table split within one node; ``moves``: a re-plan's move term over ``tables`` and
    ``devices``, whose devices are then not interchangeable). Host capacity keeps one row per
    table free, for the rows that rounding HBM memory down to whole rows sends to host
    memory."""
    dev = task.device_arrays
    per_row = task.table_arrays.memory_bytes_per_row[tables]
    full = task.table_arrays.rows[tables] * per_row / UNIT_BYTES
    slack = per_row.sum() / UNIT_BYTES
    scale, reserved = hbm_terms(task, tables)
    pinned = None
    if pins is not None and (pins[tables] >= 0).any():
        own = pins[tables][:, None]
        pinned = (own < 0) | (own == devices[None, :])
    return milp_model.Subproblem(tables, kinds.kind[devices],
                                 dev.hbm_capacity[devices] / UNIT_BYTES,
                                 dev.host_capacity[devices] / UNIT_BYTES - slack, full,
                                 np.ones(devices.size), integer=fixed is None, fixed=fixed,
                                 hbm_scale=scale, reserved=reserved,
                                 symmetric=pinned is None and moves is None, allowed=pinned,
                                 least=least_memory(task, tables), moves=moves)


def least_memory(task: ShardingTask, tables: np.ndarray | None = None) -> np.ndarray | None:
    """The MILP's least HBM memory (GB) of ``tables`` (:attr:`autoshard.task.TableArrays.
    hbm_least`); None when no table has any."""
    a = task.table_arrays
    idx = np.arange(task.num_tables) if tables is None else tables
    if not a.hbm_least[idx].any():
        return None
    return a.hbm_least[idx] * a.memory_bytes_per_row[idx] / UNIT_BYTES


def pin(task: ShardingTask, pins: np.ndarray | None, device: np.ndarray, rows: np.ndarray
        ) -> tuple[np.ndarray, np.ndarray] | None:
    """A placement with its pinned tables (``pins``: device per table, -1 where free) moved to
    their devices, keeping their HBM rows where the HBM holds them (else the least they may
    keep), every table's HBM rows within its bounds
    (:meth:`autoshard.task.TableArrays.hbm_rows_allowed`), and any HBM overshoot taken off;
    None if it no longer fits."""
    a = task.table_arrays
    bounded = a.hbm_rows_allowed(slice(None), rows)
    if (pins is None or (device[pins >= 0] == pins[pins >= 0]).all()) and (
            bounded == rows).all():
        return device, rows
    if pins is not None:
        device = np.where(pins >= 0, pins, device)
    moved = fit_hbm(task, device, bounded)
    if feasible(task, device, moved):
        return device, moved
    if pins is not None:
        bounded = a.hbm_rows_allowed(slice(None), np.where(pins >= 0, 0, bounded))
    moved = fit_hbm(task, device, bounded)
    return (device, moved) if feasible(task, device, moved) else None


def single_bound(lines: CostLines) -> float:
    """No device costs less than the dearest table's cheapest placement."""
    return float(lines.min_cost.min(axis=1).max())


def to_rows(task: ShardingTask, memory_gb: np.ndarray,
            tables: np.ndarray | None = None) -> np.ndarray:
    """HBM rows from HBM memory, rounded to the nearest row
    (:func:`autoshard.layout.feasibility.fit_hbm` then takes off any
    overshoot of the HBM capacity)."""
    idx = np.arange(task.num_tables) if tables is None else tables
    a = task.table_arrays
    rows = np.round(memory_gb * UNIT_BYTES / a.memory_bytes_per_row[idx])
    return a.hbm_rows_allowed(idx, rows)


def to_memory(task: ShardingTask, rows: np.ndarray, tables: np.ndarray | None = None
              ) -> np.ndarray:
    idx = np.arange(task.num_tables) if tables is None else tables
    return rows * task.table_arrays.memory_bytes_per_row[idx] / UNIT_BYTES


def device_loads(task: ShardingTask, cost_model: CostModel, device: np.ndarray,
                 rows: np.ndarray) -> np.ndarray:
    return device_totals(task, price_plan(task, cost_model, device, rows), device)


def step_cost(task: ShardingTask, cost_model: CostModel, device: np.ndarray,
              rows: np.ndarray) -> float:
    return float(device_loads(task, cost_model, device, rows).max())


def polish(task: ShardingTask, kinds: DeviceKinds, full: CostLines, tables: np.ndarray,
           devices: np.ndarray, position: np.ndarray, time_limit: float,
           tied: np.ndarray | None = None, moves: milp_model.MoveTerms | None = None
           ) -> np.ndarray | None:
    """Best row splits of ``tables`` kept on their devices (``devices[position]``), from the LP
    over every hull line; None if the LP found no solution. ``tied``: a group per table
    (-1: none); the tables of one group keep the same share of their rows in HBM. ``moves``:
    a re-plan's move term (the copies between host memory and HBM within its budget)."""
    from dataclasses import replace

    sub = device_subproblem(task, kinds, tables, devices, fixed=position, moves=moves)
    if tied is not None:
        sub = replace(sub, tied=tied)
    sol = milp_model.solve(sub, full, spread=1e-3, time_limit=time_limit)
    if sol.memory is None:
        return None
    rows = np.zeros(task.num_tables, dtype=np.int64)
    device = np.full(task.num_tables, -1, dtype=np.int64)
    rows[tables], device[tables] = to_rows(task, sol.memory, tables), devices[position]
    return fit_hbm(task, device, rows)[tables]


def lp_packing(task: ShardingTask, cost_model: CostModel, kinds: DeviceKinds, lines: CostLines,
               relaxed: milp_model.Solution) -> tuple[np.ndarray, np.ndarray] | None:
    """Longest-processing-time packing of the LP's row splits: dearest table first, onto the
    least loaded device of its LP kind that holds its split (else the best tier split)."""
    if relaxed.device is None or relaxed.memory is None:
        return None
    target = to_rows(task, relaxed.memory)
    kind = relaxed.device
    est = lines.cost(np.arange(task.num_tables), kind, relaxed.memory)
    state = PlacementState(task, cost_model)
    try:
        for t in np.argsort(-est, kind="stable"):
            t = int(t)
            want = np.full(task.num_devices, target[t])
            ok = state.fits(t, want) & (kinds.kind == kind[t])
            if ok.any():
                choice = np.flatnonzero(ok)
                state.place(t, int(choice[np.argmin(state.load_ms[choice])]), int(target[t]))
            else:
                state.place(t, *state.best_split(t))
    except PlannerError:
        return None
    return state.device, state.hbm_rows

"""The evaluator: what a plan costs, per device and in all, and how far from the lower bound."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from autoshard.layout.plan import Plan, hbm_use
from autoshard.layout.shards import (
    ShardLayout,
    check_layout,
    plan_layout,
    pricing_task,
    shard_memory,
)
from autoshard.pricing.bounds import lower_bound_ms
from autoshard.pricing.cost import CostModel, Pricing, device_compute
from autoshard.task import ShardingTask


@dataclass(frozen=True)
class DeviceReport:
    """One device's share of a step: compute by tier, communication and memory by tier;
    ``tables`` counts the whole tables and shards it holds. HBM: ``hbm_bytes`` the weights
    (and optimizer state) of the rows kept there, ``hbm_reserved_bytes`` what the task's
    runtime keeps beside them (its reservation: I/O buffers, cache state), ``hbm_free_bytes``
    what is left of ``hbm_capacity_bytes``."""

    device: int
    tables: int
    hbm_ms: float
    uvm_ms: float
    comm_ms: float
    total_ms: float
    hbm_bytes: int
    host_bytes: int
    hbm_capacity_bytes: int
    host_capacity_bytes: int
    lookups: float
    uvm_lookups: float
    hbm_reserved_bytes: int = field(default=0, kw_only=True)
    hbm_free_bytes: int = field(default=0, kw_only=True)


@dataclass(frozen=True)
class CostReport:
    """A plan's cost under one cost model.

    ``step_cost_ms`` is the max over devices; ``load_balance`` is max / mean of device totals;
    ``uvm_lookup_share`` is the share of all lookups served from host memory; ``cost_ratio`` is
    step cost / lower bound (1.0 = provably optimal).

    ``lower_bound_ms`` is valid for the task as posed: it counts the HBM the task's
    reservation keeps (:func:`autoshard.pricing.bounds.lower_bound_ms` with ``reserved``);
    ``weights_bound_ms`` counts the rows' weights alone (the same tables on a runtime that keeps
    nothing), lower where the task reserves HBM. ``reservation`` names the task's reservation.
    ``shardings`` counts the plan's tables by sharding kind.
    """

    sharder: str
    cost_model: str
    mode: str
    batch_size: int
    step_cost_ms: float
    lower_bound_ms: float
    cost_ratio: float
    load_balance: float
    uvm_lookup_share: float
    per_device: tuple[DeviceReport, ...]
    access_assumptions: dict[str, int]
    measured: bool = False
    weights_bound_ms: float | None = None
    reservation: str = "none"
    shardings: dict[str, int] | None = None  # tables per sharding kind

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["per_device"] = [asdict(d) for d in self.per_device]
        return doc


def price_plan(task: ShardingTask, cost_model: CostModel, device: np.ndarray,
               hbm_rows: np.ndarray) -> Pricing:
    """Per-table prices of a whole-table placement given as arrays in task order."""
    return cost_model.price(task, np.arange(task.num_tables), device, hbm_rows)


def device_totals(task: ShardingTask, pricing: Pricing, device: np.ndarray) -> np.ndarray:
    """Sum of table (or shard) prices per device, ms ([D])."""
    return np.bincount(device, weights=pricing.total_ms, minlength=task.num_devices)


def step_cost_ms(items: ShardingTask, cost_model: CostModel, device: np.ndarray,
                 rows: np.ndarray) -> float:
    """The step cost of items on ``device`` with ``rows`` in HBM, as :func:`evaluate` prices it
    (a model that prices a device's whole table set included)."""
    p = cost_model.price(items, np.arange(items.num_tables), device, rows)
    n = items.num_devices
    hbm, uvm, comm = (np.bincount(device, weights=v, minlength=n)
                      for v in (p.hbm_ms, p.uvm_ms, p.comm_ms))
    hbm, uvm = device_compute(items, cost_model, device, rows, hbm, uvm)
    return float((hbm + uvm + comm).max())


def task_bound_ms(task: ShardingTask, cost_model: CostModel) -> float:
    """The lower bound :func:`evaluate` reports for plans of ``task`` (with no bound given):
    counting the HBM its reservation keeps, replicas included."""
    return lower_bound_ms(task, cost_model, reserved=task.reservation.keeps_room, replicas=True)


def plan_cost_ms(plan: Plan, task: ShardingTask, cost_model: CostModel) -> float:
    """A plan's step cost as :func:`evaluate` prices it, without its capacity checks and lower
    bound (for plans valid by construction)."""
    layout = plan_layout(plan, task)
    items = pricing_task(task, layout.geometry)
    return step_cost_ms(items, cost_model, layout.device, layout.hbm_rows)


def evaluate(plan: Plan, task: ShardingTask, cost_model: CostModel,
             bound_ms: float | None = None, source: str = "plan") -> CostReport:
    """Validates and prices a plan, whole tables and shards alike.

    Args:
        plan: The plan to price.
        task: The task it places.
        cost_model: Prices the tables' shards.
        bound_ms: A known lower bound (e.g. from a MILP relaxation); the report uses the larger of
            it and :func:`autoshard.pricing.bounds.lower_bound_ms`.
        source: Where the plan came from, for error messages.

    Raises:
        PlannerError: The plan is invalid or over a capacity.
        InputError: A shard does not fit its table or names a device the hardware lacks.
    """
    layout = check_layout(plan, task, source)
    devices = _device_reports(task, cost_model, layout)
    total = np.array([d.total_ms for d in devices])
    lookups = np.array([d.lookups for d in devices])
    uvm_lookups = np.array([d.uvm_lookups for d in devices])
    step = float(total.max())
    weights = lower_bound_ms(task, cost_model, replicas=True)
    bound = task_bound_ms(task, cost_model) if task.reservation.keeps_room else weights
    if bound_ms is not None:
        bound = max(bound, bound_ms)
    mean = float(total.mean())
    return CostReport(
        sharder=plan.sharder,
        cost_model=cost_model.name,
        mode=task.workload.mode,
        batch_size=task.workload.batch_size,
        step_cost_ms=step,
        lower_bound_ms=bound,
        cost_ratio=step / bound if bound > 0 else float("inf"),
        load_balance=step / mean if mean > 0 else 1.0,
        uvm_lookup_share=float(uvm_lookups.sum() / max(lookups.sum(), 1e-300)),
        per_device=devices,
        access_assumptions=dict(Counter(t.access_source for t in task.tables)),
        weights_bound_ms=weights, reservation=task.reservation.name,
        shardings=plan.sharding_counts(),
    )


def _device_reports(task: ShardingTask, cost_model: CostModel, layout: ShardLayout
                    ) -> tuple[DeviceReport, ...]:
    """Each device's share of a step: its shards priced, by tier, and its memory."""
    priced = pricing_task(task, layout.geometry)
    device = layout.device
    shards = np.arange(layout.num_shards)
    pricing = cost_model.price(priced, shards, device, layout.hbm_rows)
    n = task.num_devices
    share = priced.hbm_share(shards, layout.hbm_rows)
    # A column block sees every lookup of its table; weigh it by its share of the columns so
    # that a table's lookups count once however it is split.
    g = layout.geometry
    lookup = priced.table_arrays.lookups * g.cols / task.table_arrays.dim[g.table]

    def per_dev(values: np.ndarray) -> np.ndarray:
        return np.bincount(device, weights=values, minlength=n)

    hbm_ms, uvm_ms, comm_ms = per_dev(pricing.hbm_ms), per_dev(pricing.uvm_ms), per_dev(
        pricing.comm_ms)
    hbm_ms, uvm_ms = device_compute(priced, cost_model, device, layout.hbm_rows, hbm_ms,
                                    uvm_ms)
    total = hbm_ms + uvm_ms + comm_ms
    lookups, uvm_lookups = per_dev(lookup), per_dev(lookup * (1.0 - share))
    used_hbm, used_host = shard_memory(task, layout)
    runtime = hbm_use(priced, device, layout.hbm_rows)  # rows and reservation, as counted
    dev = task.device_arrays
    counts = np.bincount(device, minlength=n)
    return tuple(
        DeviceReport(d, int(counts[d]), float(hbm_ms[d]), float(uvm_ms[d]), float(comm_ms[d]),
                     float(total[d]), int(used_hbm[d]), int(used_host[d]),
                     int(dev.hbm_capacity[d]), int(dev.host_capacity[d]), float(lookups[d]),
                     float(uvm_lookups[d]),
                     hbm_reserved_bytes=int(max(runtime[d] - used_hbm[d], 0.0)),
                     hbm_free_bytes=int(dev.hbm_capacity[d] - max(runtime[d], used_hbm[d])))
        for d in range(n)
    )

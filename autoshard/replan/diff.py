"""What moves between the plan in use and a new plan, and what the move costs: per table, per
link, in seconds, and against the steps it saves.

:func:`move_report` prices a new plan's copies against a re-plan's :class:`autoshard.replan.
budget.Moves` (:mod:`autoshard.replan.moves` gives the arithmetic): the bytes of weights and
optimizer state over each link, the move's time at the hardware's bandwidths, the step cost of
the plan in use (carried onto the new task) and of the new plan, and the steps after which the
move has paid for itself. :func:`diff_plans` adds the table-by-table list that
``autoshard diff OLD NEW`` prints.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from autoshard.layout.plan import Placement, Plan
from autoshard.layout.shards import ShardLayout, plan_layout, pricing_task
from autoshard.pricing.cost import CostModel
from autoshard.pricing.evaluator import step_cost_ms
from autoshard.replan.budget import MoveBudget, Moves
from autoshard.replan.carry import carry
from autoshard.replan.moves import Link
from autoshard.task import ShardingTask


@dataclass(frozen=True)
class LinkBytes:
    """Bytes copied over one kind of link: in all, and of them weights and optimizer state."""

    link: str
    bytes: float
    weight_bytes: float

    @property
    def optimizer_bytes(self) -> float:
        return self.bytes - self.weight_bytes


@dataclass(frozen=True)
class MoveReport:
    """A new plan's move from the plan in use, priced.

    Args:
        budget: The budget, in words.
        limit_bytes: Its limit in bytes (None: none).
        total_bytes: The new task's tables' bytes (weights and optimizer state).
        copied_bytes: Bytes the move copies (every link).
        links: Bytes per link (:class:`LinkBytes`; intra-node, inter-node, host-HBM).
        seconds: The move's time at the hardware's bandwidths, s (:mod:`autoshard.replan.moves`).
        slowest_device: The rank that takes longest (-1: nothing copied).
        tables_moved: Tables with bytes sent to another device.
        tables_changed: Tables with any byte copied (moved, or HBM rows changed in place).
        before_ms: The plan in use's step cost on the new task (carried onto it), ms.
        after_ms: The new plan's step cost, ms.
        payback_steps: Steps after which the move's time is won back (the move's time over the
            step time saved); None where the new plan saves nothing.
        forced_bytes: What the carried plan itself copies (the least any re-plan copies).
        price_ms: The moves' price per step where they are priced, ms (0 otherwise).
        budget_bound_ms: A lower bound on the step cost of every plan within the budget that
            keeps the carried plan's splits, where the sharder proved one (``recshard``).
        notes: What the carry changed, and which plan won.
    """

    budget: str
    limit_bytes: float | None
    total_bytes: float
    copied_bytes: float
    links: tuple[LinkBytes, ...]
    seconds: float
    slowest_device: int
    tables_moved: int
    tables_changed: int
    before_ms: float
    after_ms: float
    payback_steps: float | None
    forced_bytes: float = 0.0
    price_ms: float = 0.0
    budget_bound_ms: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def copied_share(self) -> float:
        """Share of the tables' bytes the move copies."""
        return self.copied_bytes / self.total_bytes if self.total_bytes > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["links"] = [dict(asdict(x), optimizer_bytes=x.optimizer_bytes) for x in self.links]
        doc["copied_share"] = self.copied_share
        return doc


def move_report(moves: Moves, layout: ShardLayout, cost_model: CostModel,
                budget_bound_ms: float | None = None, notes: tuple[str, ...] = ()
                ) -> MoveReport:
    """The move of ``layout`` (of ``moves.task``) from the plan in use, priced."""
    task = moves.task
    arithmetic = moves.items(layout.geometry)
    copied = arithmetic.copied(layout.device, layout.hbm_rows)
    network = arithmetic.network()[np.arange(layout.num_shards), layout.device]
    g = layout.geometry
    time = moves.time(layout)
    before = _cost(task, moves.carried, cost_model)
    after = _cost(task, layout, cost_model)
    total = float((task.table_arrays.rows * task.table_arrays.memory_bytes_per_row).sum())
    saved = before - after
    return MoveReport(
        budget=moves.budget.describe(),
        limit_bytes=moves.limit_bytes if moves.limited else None,
        total_bytes=total, copied_bytes=float(copied.sum()),
        links=tuple(LinkBytes(k.value, *v) for k, v in moves.by_link(layout).items()),
        seconds=time.seconds, slowest_device=time.slowest,
        tables_moved=int(np.unique(g.table[network > 0.5]).size),
        tables_changed=int(np.unique(g.table[copied > 0.5]).size),
        before_ms=before, after_ms=after,
        payback_steps=1e3 * time.seconds / saved if saved > 1e-12 else None,
        forced_bytes=moves.forced_bytes, price_ms=moves.price_ms(layout),
        budget_bound_ms=budget_bound_ms, notes=(*moves.notes, *notes))


def _cost(task: ShardingTask, layout: ShardLayout, cost_model: CostModel) -> float:
    items = pricing_task(task, layout.geometry)
    return step_cost_ms(items, cost_model, layout.device, layout.hbm_rows)


@dataclass(frozen=True)
class TableMove:
    """One table's change between two plans.

    Args:
        table: Its name.
        change: ``created`` (only the new plan holds it), ``removed`` (only the old one),
            ``moved`` (bytes sent to another device), ``resplit`` (its split changed),
            ``hbm`` (only HBM rows changed in place).
        before: The old placement: its sharding kind and its shards' devices, in words.
        after: The new one.
        hbm_before: Its rows in HBM in the old plan (all shards; None: not there).
        hbm_after: In the new plan (None: not there).
        network_bytes: Bytes sent to other devices.
        host_bytes: Bytes copied between host memory and HBM.
    """

    table: str
    change: str
    before: str
    after: str
    hbm_before: int | None = None
    hbm_after: int | None = None
    network_bytes: float = 0.0
    host_bytes: float = 0.0


@dataclass(frozen=True)
class PlanDiff:
    """Two plans' difference: each changed table, and the move priced."""

    tables: tuple[TableMove, ...]
    report: MoveReport

    def to_dict(self) -> dict[str, Any]:
        return {"tables": [asdict(t) for t in self.tables], "report": self.report.to_dict()}


def diff_plans(old: Plan, new: Plan, task: ShardingTask, cost_model: CostModel) -> PlanDiff:
    """What moves from ``old`` (made on its context's hardware, else ``task``'s) to ``new`` (a
    plan of ``task``), table by table, and the move priced (:func:`move_report`)."""
    moves = carry(old, task, cost_model, MoveBudget())
    layout = plan_layout(new, task, "new plan")
    arithmetic = moves.items(layout.geometry)
    g = layout.geometry
    i = np.arange(layout.num_shards)
    network = np.bincount(g.table, weights=arithmetic.network()[i, layout.device],
                          minlength=task.num_tables)
    host = np.bincount(g.table, weights=arithmetic.host_bytes(layout.device, layout.hbm_rows),
                       minlength=task.num_tables)
    before = {p.table: p for p in old.placements}
    after = {p.table: p for p in new.placements}
    rows = []
    for t, table in enumerate(task.tables):
        now, then = after[table.name], before.get(table.name)
        change = _change(then, now, bool(moves.incumbent.created[t]), network[t], host[t])
        if change:
            rows.append(TableMove(table.name, change, _words(then), _words(now),
                                  None if then is None else then.hbm_rows, now.hbm_rows,
                                  float(network[t]), float(host[t])))
    rows += [TableMove(name, "removed", _words(before[name]), "-", before[name].hbm_rows)
             for name in moves.incumbent.removed]
    return PlanDiff(tuple(rows), move_report(moves, layout, cost_model))


def _change(then: Placement | None, now: Placement, created: bool, network: float,
            host: float) -> str:
    """The kind of a table's change ('' when none)."""
    if then is None or created:
        return "created"
    if (then.sharding, tuple((s.row_start, s.row_end, s.col_start, s.col_end)
                             for s in then.shards)) != (now.sharding, tuple(
            (s.row_start, s.row_end, s.col_start, s.col_end) for s in now.shards)):
        return "resplit"
    if network > 0.5:
        return "moved"
    return "hbm" if host > 0.5 else ""


def _words(p: Placement | None) -> str:
    """A placement's devices in words: ``3``, or ``column_wise 0,1`` (``,...`` past 6)."""
    if p is None:
        return "-"
    if not p.is_split:
        return str(p.device)
    devices = ",".join(str(s.device) for s in p.shards[:6]) + (",..." if len(p.shards) > 6
                                                               else "")
    return f"{p.sharding.value} {devices}"


def link_label(link: str) -> str:
    """A link's name in words."""
    return {Link.INTRA_NODE.value: "intra-node", Link.INTER_NODE.value: "inter-node",
            Link.HOST_HBM.value: "host-HBM"}.get(link, link)


def payback_words(report: MoveReport) -> str:
    """The move against the steps it saves, in words."""
    if report.payback_steps is None:
        return "the new plan saves no step time"
    if not math.isfinite(report.payback_steps):
        return "the move never pays back"
    return f"the move pays back after {report.payback_steps:,.0f} steps"


__all__ = ["LinkBytes", "MoveReport", "PlanDiff", "TableMove", "diff_plans", "link_label",
           "move_report", "payback_words"]

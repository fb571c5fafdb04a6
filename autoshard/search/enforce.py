"""Any plan brought within its items' HBM bounds and its task's constraints
(:mod:`autoshard.layout.constraints`).

The sharders choose kinds and devices knowing the constraints' kinds (the split choice offers
only the allowed ones), and the MILP keeps every item's HBM rows within its bounds; a sharder
that does not (a greedy one) has them applied here, and the other tables' HBM water-filled
around them on the same devices (:class:`autoshard.search.move_search.Polisher` with those rows
locked).
"""

from __future__ import annotations

import numpy as np

from autoshard.errors import PlannerError, gib
from autoshard.layout.kinds import ShardingKind
from autoshard.layout.shards import ShardLayout, pricing_task
from autoshard.pricing.cost import CostModel
from autoshard.pricing.curves import Curves
from autoshard.search.move_search import Polisher
from autoshard.task import ShardingTask


def enforce(task: ShardingTask, layout: ShardLayout, cost_model: CostModel) -> ShardLayout:
    """``layout`` (a :class:`autoshard.layout.shards.ShardLayout` of ``task``) with every item's HBM
    rows within its bounds (:attr:`autoshard.task.TableArrays.hbm_least` and ``hbm_most``:
    its table's constraints; every row of a replica) and the other items' HBM water-filled
    around the bounded ones (:class:`autoshard.search.move_search.Polisher`), the devices
    unchanged. A layout already within bounds is returned as it is.

    Raises:
        PlannerError: A kind the constraints do not allow, or a device whose HBM cannot hold
            the rows the bounds require (the tables and the bytes named).
    """
    constraints = task.constraints
    g = layout.geometry
    for t, table in enumerate(task.tables):
        kind = ShardingKind.of(g.kind[np.flatnonzero(g.table == t)[0]])
        if not constraints.of(table.name).allows(kind):
            raise PlannerError("constraint", f"table '{table.name}' planned {kind.value}, "
                               f"which its constraints do not allow")
    items = pricing_task(task, g)
    a = items.table_arrays
    rows = a.hbm_rows_allowed(slice(None), layout.hbm_rows)
    moved = rows != layout.hbm_rows
    if not moved.any():
        return layout
    locked = moved | (a.hbm_least == a.hbm_most)
    filled = Polisher(items, cost_model, Curves.price(items, cost_model), layout.device, rows,
                      locked=locked)
    _check_room(items, filled.hbm_cap, layout.device, locked)
    return ShardLayout(g, layout.device, a.hbm_rows_allowed(slice(None), filled.filled_rows()))


def _check_room(items: ShardingTask, room: np.ndarray, device: np.ndarray,
                locked: np.ndarray) -> None:
    """Fails when the locked rows (and the reservations) overfill a device's HBM."""
    over = np.flatnonzero(room < -1e-6)
    if over.size:
        d = int(over[0])
        names = sorted({items.tables[i].name for i in np.flatnonzero(locked & (device == d))})
        raise PlannerError("capacity", f"device {d}: the HBM rows its constraints require "
                           f"({', '.join(names[:4])}) exceed its HBM by {gib(-room[d])}")

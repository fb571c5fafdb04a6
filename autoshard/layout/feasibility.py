"""Whether a placement's rows fit its devices' memory, and the repair of a small HBM overshoot.

A placement here is a device and a count of HBM rows per table (or shard) of a task, as the
MILP, the searches and the sharders pass them between their steps; what a row takes in each
tier is :func:`autoshard.layout.plan.memory_use` and :func:`autoshard.layout.plan.hbm_use`.
"""

from __future__ import annotations

import numpy as np

from autoshard.layout.plan import hbm_use, memory_use
from autoshard.task import ShardingTask


def feasible(task: ShardingTask, device: np.ndarray, rows: np.ndarray) -> bool:
    """Whether every device's HBM (rows and reservations) and host memory hold their part."""
    _, host = memory_use(task, device, rows)
    hbm = hbm_use(task, device, rows)
    dev = task.device_arrays
    return bool((hbm <= dev.hbm_capacity).all() and (host <= dev.host_capacity).all())


def fit_hbm(task: ShardingTask, device: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows with any HBM overshoot (a solver's tolerance, a few bytes) taken off the table
    with the most HBM rows it may give up on each overfull device (never below its
    :attr:`autoshard.task.TableArrays.hbm_least`)."""
    a = task.table_arrays
    rows = rows.copy()
    per_row = a.hbm_bytes_per_row
    placed = device >= 0  # tables outside a subproblem are marked -1
    hbm = np.bincount(device[placed], weights=a.hbm_bytes(placed, rows[placed]),
                      minlength=task.num_devices)
    for d in np.flatnonzero(hbm > task.device_arrays.hbm_capacity):
        on = np.flatnonzero(device == d)
        spare = (rows[on] - a.hbm_least[on]) * per_row[on]
        t = on[np.argmax(spare)]
        excess = hbm[d] - task.device_arrays.hbm_capacity[d]
        rows[t] = max(rows[t] - int(np.ceil(excess / per_row[t])), int(a.hbm_least[t]))
    return rows

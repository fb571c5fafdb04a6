"""Table-to-server mapping strategies (the baselines of Lui et al., ISPASS 2021).

Each answers ``map(task, servers) -> Mapping`` and is found through
:mod:`autoshard.serving.registry`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autoshard.errors import PlannerError, gib
from autoshard.serving.mapping import MAIN, Mapping
from autoshard.serving.task import ServingTask


class Singular:
    """Every table on the main server (no remote calls); only when it fits."""

    summary = "everything on the main server, when it fits"
    needs_servers = False

    def map(self, task: ServingTask, servers: int = 0) -> Mapping:
        total = float(task.model.table_bytes().sum())
        if total > task.profile.main_bytes:
            raise PlannerError("capacity", f"the tables need {gib(total)}, the main server "
                               f"holds {gib(task.profile.main_bytes)}")
        return Mapping(0, (MAIN,) * task.model.num_tables, "singular")


class _TableGreedy:
    """Tables one by one, largest key first, onto the fitting server with the least key."""

    summary = ""
    name = ""
    by = "bytes"
    needs_servers = True

    def key(self, task: ServingTask) -> np.ndarray:
        raise NotImplementedError

    def map(self, task: ServingTask, servers: int) -> Mapping:
        check_servers(task, servers)
        weight = self.key(task)
        units = [np.array([t]) for t in range(task.model.num_tables)]
        assign = greedy(units, task.costs.bytes, weight, servers, task.profile.server_bytes,
                        self.by)
        return Mapping(servers, tuple(int(s) for s in assign), self.name)


class CapacityBalanced(_TableGreedy):
    """Balances bytes: largest table first onto the server with the fewest bytes."""

    summary = "balances memory: largest table first onto the emptiest server"
    name = "capacity_balanced"
    by = "bytes"

    def key(self, task: ServingTask) -> np.ndarray:
        return task.costs.bytes


class LoadBalanced(_TableGreedy):
    """Balances expected lookup work per request across servers."""

    summary = "balances expected lookup work per request across servers"
    name = "load_balanced"
    by = "load"

    def key(self, task: ServingTask) -> np.ndarray:
        return task.costs.expected_us


class FeatureGroup:
    """Bin-packs whole feature groups (tables a request uses together) to cut fan-out."""

    summary = "packs each feature group whole on one server, least-loaded first"
    name = "feature_group"
    needs_servers = True

    def map(self, task: ServingTask, servers: int) -> Mapping:
        check_servers(task, servers)
        groups = task.costs.group
        units = [np.flatnonzero(groups == g) for g in range(task.costs.group_p.size)]
        units = [u for u in units if u.size]
        assign = greedy(units, task.costs.bytes, task.costs.expected_us, servers,
                        task.profile.server_bytes, "load", key_by="bytes")
        return Mapping(servers, tuple(int(s) for s in assign), self.name)


def check_servers(task: ServingTask, servers: int) -> None:
    """Rejects a server count below the memory bound or above the profile's limit."""
    low = max(task.min_servers(), 1)
    if servers < low or servers > task.profile.max_servers:
        raise PlannerError("capacity", f"{servers} sparse servers: the tables need at least "
                           f"{low} (of {gib(task.profile.server_bytes)} each), the profile "
                           f"allows at most {task.profile.max_servers}")


def greedy(units: Sequence[np.ndarray], table_bytes: np.ndarray, table_load: np.ndarray,
           servers: int, capacity: float, by: str, key_by: str | None = None) -> np.ndarray:
    """Places units (lists of tables) in decreasing order of ``key_by`` (default ``by``): each
    whole onto the fitting server with the least ``by`` (``"bytes"`` or ``"load"``); a unit that
    fits nowhere whole is split, table by table, the same way.

    Raises:
        PlannerError: A table fits on no server.
    """
    unit_bytes = np.array([table_bytes[u].sum() for u in units])
    unit_load = np.array([table_load[u].sum() for u in units])
    sort_key = unit_bytes if (key_by or by) == "bytes" else unit_load
    used = np.zeros(servers)
    load = np.zeros(servers)
    assign = np.full(table_bytes.size, MAIN, dtype=np.int64)
    pending = [units[i] for i in np.argsort(-sort_key, kind="stable")]
    while pending:
        unit = pending.pop(0)
        size = float(table_bytes[unit].sum())
        fits = np.flatnonzero(used + size <= capacity * (1 + 1e-12))
        if not fits.size:
            if unit.size == 1:
                raise PlannerError("capacity", f"{servers} servers of {gib(capacity)} cannot "
                                   f"hold the tables: a {gib(size)} table fits on none "
                                   f"(the fullest holds {gib(used.max())})")
            parts = unit[np.argsort(-table_bytes[unit], kind="stable")]
            pending = [np.array([t]) for t in parts] + pending
            continue
        s = int(fits[np.argmin((used if by == "bytes" else load)[fits])])
        assign[unit] = s
        used[s] += size
        load[s] += float(table_load[unit].sum())
    return assign

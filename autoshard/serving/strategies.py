"""Table-to-server mapping strategies (the baselines of Lui et al., ISPASS 2021, and ElasticRec's
hot and cold shards).

Each answers ``map(task, servers) -> Mapping`` (``servers`` sparse shards, one replica each;
:mod:`autoshard.serving.provision` adds replicas) and is found through
:mod:`autoshard.serving.registry`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autoshard.errors import PlannerError, gib
from autoshard.serving.hotcold import hot_cold_parts
from autoshard.serving.mapping import MAIN, Mapping
from autoshard.serving.task import ServingTask


class MainOnly:
    """Every table on the main server (no remote call); only when it fits."""

    summary = "everything on the main server (no remote call), when it fits"
    name = "main_only"
    needs_servers = False

    def map(self, task: ServingTask, servers: int = 0) -> Mapping:
        if servers:
            raise PlannerError("capacity", f"main_only uses no sparse server (asked for "
                               f"{servers})")
        total = task.total_bytes()
        if total > task.profile.usable_main_bytes:
            raise PlannerError("capacity", f"the tables need {gib(total)}, the main server "
                               f"holds {gib(task.profile.usable_main_bytes)} less headroom")
        return Mapping(0, (MAIN,) * task.base_parts.size, self.name, parts=task.base_parts)


class _PartGreedy:
    """Parts one by one, largest key first, onto the fitting server with the least key."""

    summary = ""
    name = ""
    by = "bytes"
    needs_servers = True

    def key(self, task: ServingTask) -> np.ndarray:
        raise NotImplementedError

    def map(self, task: ServingTask, servers: int) -> Mapping:
        check_servers(task, servers)
        costs = task.costs
        units = [np.array([p]) for p in range(costs.bytes.size)]
        assign = greedy(units, costs.bytes, self.key(task), servers,
                        task.profile.usable_server_bytes, self.by)
        return Mapping(servers, tuple(int(s) for s in assign), self.name,
                       parts=task.base_parts)


class CapacityBalanced(_PartGreedy):
    """Balances bytes: largest table first onto the server with the fewest bytes."""

    summary = "balances memory: largest table first onto the emptiest server"
    name = "capacity_balanced"
    by = "bytes"

    def key(self, task: ServingTask) -> np.ndarray:
        return task.costs.bytes


class LoadBalanced(_PartGreedy):
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
        costs = task.costs
        units = [np.flatnonzero(costs.group == g) for g in range(costs.group_p.size)]
        units = [u for u in units if u.size]
        assign = greedy(units, costs.bytes, costs.expected_us, servers,
                        task.profile.usable_server_bytes, "load", key_by="bytes")
        return Mapping(servers, tuple(int(s) for s in assign), self.name,
                       parts=task.base_parts)


class HotCold:
    """ElasticRec's split: each table cut into hot and cold row ranges by its access curve
    (a DP over the curve minimising memory times replicas); hot parts packed together, hottest
    per byte first, onto as few shards as hold them (which provisioning then replicates), then
    cold parts by bytes."""

    summary = "splits tables into hot and cold parts by access curve (ElasticRec), hot packed"
    name = "hot_cold"
    needs_servers = True

    def map(self, task: ServingTask, servers: int) -> Mapping:
        check_servers(task, servers)
        parts, hot = hot_cold_parts(task)
        costs = task.costs_for(parts)
        cap = task.profile.usable_server_bytes
        assign, used, load = pack_hot(np.flatnonzero(hot), costs.bytes, costs.expected_us,
                                      servers, cap)
        rest = [np.array([p]) for p in np.flatnonzero(~hot)]
        assign, _, _ = greedy_state(rest, costs.bytes, costs.expected_us, servers, cap,
                                    "bytes", start=(assign, used, load))
        return Mapping(servers, tuple(int(s) for s in assign), self.name, parts=parts,
                       note=f"{int(hot.sum())} hot parts")


def pack_hot(hot: np.ndarray, part_bytes: np.ndarray, part_load: np.ndarray, servers: int,
             capacity: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hot parts, hottest per byte first, each onto the first shard with room (first fit)."""
    assign = np.full(part_bytes.size, MAIN, dtype=np.int64)
    used, load = np.zeros(servers), np.zeros(servers)
    density = part_load[hot] / np.maximum(part_bytes[hot], 1.0)
    for p in hot[np.argsort(-density, kind="stable")]:
        fits = np.flatnonzero(used + part_bytes[p] <= capacity * (1 + 1e-12))
        if not fits.size:
            raise PlannerError("capacity", f"a {gib(part_bytes[p])} hot part fits on no shard")
        s = int(fits[0])
        assign[p] = s
        used[s] += part_bytes[p]
        load[s] += part_load[p]
    return assign, used, load


def check_servers(task: ServingTask, servers: int) -> None:
    """Rejects a server count below the memory bound or above the profile's limit."""
    low = max(task.min_servers(), 1)
    if servers < low or servers > task.profile.max_servers:
        raise PlannerError("capacity", f"{servers} sparse servers: the tables need at least "
                           f"{low} (of {gib(task.profile.usable_server_bytes)} usable each), "
                           f"the profile allows at most {task.profile.max_servers}")


def greedy(units: Sequence[np.ndarray], part_bytes: np.ndarray, part_load: np.ndarray,
           servers: int, capacity: float, by: str, key_by: str | None = None) -> np.ndarray:
    """Places units (lists of parts) in decreasing order of ``key_by`` (default ``by``): each
    whole onto the fitting server with the least ``by`` (``"bytes"`` or ``"load"``); a unit that
    fits nowhere whole is split, part by part, the same way.

    Raises:
        PlannerError: A part fits on no server.
    """
    return greedy_state(units, part_bytes, part_load, servers, capacity, by, key_by)[0]


def greedy_state(units: Sequence[np.ndarray], part_bytes: np.ndarray, part_load: np.ndarray,
                 servers: int, capacity: float, by: str, key_by: str | None = None,
                 start: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`greedy` from a given (assign, bytes used, load) state; returns the new state."""
    if start is None:
        assign = np.full(part_bytes.size, MAIN, dtype=np.int64)
        used, load = np.zeros(servers), np.zeros(servers)
    else:
        assign, used, load = (a.copy() for a in start)
    unit_bytes = np.array([part_bytes[u].sum() for u in units])
    unit_load = np.array([part_load[u].sum() for u in units])
    sort_key = unit_bytes if (key_by or by) == "bytes" else unit_load
    pending = [units[i] for i in np.argsort(-sort_key, kind="stable")]
    while pending:
        unit = pending.pop(0)
        size = float(part_bytes[unit].sum())
        fits = np.flatnonzero(used + size <= capacity * (1 + 1e-12))
        if not fits.size:
            if unit.size == 1:
                raise PlannerError("capacity", f"{servers} servers of {gib(capacity)} cannot "
                                   f"hold the tables: a {gib(size)} part fits on none "
                                   f"(the fullest holds {gib(used.max())})")
            parts = unit[np.argsort(-part_bytes[unit], kind="stable")]
            pending = [np.array([t]) for t in parts] + pending
            continue
        s = int(fits[np.argmin((used if by == "bytes" else load)[fits])])
        assign[unit] = s
        used[s] += size
        load[s] += float(part_load[unit].sum())
    return assign, used, load

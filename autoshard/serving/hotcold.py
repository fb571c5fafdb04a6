"""Splits by heat: ElasticRec's hot and cold shards, and hot rows on the main server.

Both rest on a table's access curve (the share of its lookups its hottest rows serve,
:meth:`autoshard.tables.Table.access_curve`); rows are renumbered hottest first, so a part
``[lo, hi)`` of the renumbered table serves ``curve(hi) - curve(lo)`` of its lookups.

- :func:`hot_cold_parts`: ElasticRec (Choi et al., ISCA 2024) cuts each table by a dynamic
  program over its access curve so that memory times replicas is least, a part's replicas
  being its load over what one server takes below the utilisation ceiling (at least one). A
  table that no server's load limit binds is left whole.
- :func:`with_main_cache`: HugeCTR's hierarchical parameter server keeps hot rows on the serving
  node. Here the main server's spare memory (less headroom) takes the hottest rows of remote
  tables, the rows that avoid the most remote lookups per byte first. The rows move: a shard no
  longer holds them (a static cache, chosen from the curves, not filled at run time).
"""

from __future__ import annotations

import numpy as np

from autoshard.access import GRID
from autoshard.serving.mapping import MAIN, Mapping
from autoshard.serving.parts import PartSet
from autoshard.serving.task import ServingTask

#: Cut points the hot/cold program chooses among (row fractions, 1e-5 to 1/2).
CUTS = np.logspace(-5.0, np.log10(0.5), 24)
#: Most parts the program cuts a table into (hot, warm, cold).
MAX_PARTS = 3
#: A split must save this share of a table's memory times replicas to be made.
MIN_SAVING = 0.01


def _unit_costs(task: ServingTask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per base part: (touch probability, cost per lookup in us, fixed cost per touch in us)."""
    costs, prof = task.costs, task.profile
    _, lookups = task.base_parts.touch(task.model)
    fixed = prof.table_overhead_us + prof.call_table_overhead_us
    per_lookup = (costs.work_us + costs.transfer_us - fixed) / np.maximum(lookups, 1e-9)
    return costs.touch_p, np.maximum(per_lookup, 0.0), np.full(lookups.size, fixed)


def _split_table(points: np.ndarray, share: np.ndarray, size: float, lookups: float,
                 touch: float, per_lookup: float, fixed: float, cap_us: float
                 ) -> list[float]:
    """The cuts (row fractions) of one table that minimise memory times replicas."""
    m = points.size
    a, b = np.triu_indices(m, k=1)
    s = np.clip(share[b] - share[a], 0.0, 1.0)
    q = -np.expm1(lookups * np.log1p(-np.minimum(s, 1 - 1e-12)))
    load = touch * (lookups * s * per_lookup + q * fixed)
    cost = np.full((m, m), np.inf)
    cost[a, b] = size * (points[b] - points[a]) * np.maximum(1.0, load / cap_us)
    best = np.full((MAX_PARTS + 1, m), np.inf)
    back = np.zeros((MAX_PARTS + 1, m), dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, MAX_PARTS + 1):
        total = best[k - 1][:, None] + cost
        back[k] = total.argmin(axis=0)
        best[k] = total.min(axis=0)
    k = int(np.argmin(best[:, -1]))
    if best[k, -1] > best[1, -1] * (1 - MIN_SAVING):
        return []
    cuts, at = [], m - 1
    while k > 1:
        at = int(back[k, at])
        cuts.append(float(points[at]))
        k -= 1
    return sorted(cuts)


def hot_cold_parts(task: ServingTask) -> tuple[PartSet, np.ndarray]:
    """(parts, which are hot): each whole table cut by :func:`_split_table`; a table's
    hottest part is hot when it was cut."""
    parts = task.base_parts
    touch, per_lookup, fixed = _unit_costs(task)
    _, lookups = parts.touch(task.model)
    prof = task.profile
    cap_us = prof.cores * prof.utilisation_ceiling * 1e6 / task.qps
    points = np.r_[0.0, CUTS, 1.0]
    hot: list[int] = []
    for i in range(parts.size):
        if parts.lo[i] != 0 or parts.hi[i] != 1:
            continue
        curve = task.model.tables[parts.table[i]].access_curve()
        cuts = _split_table(points, curve.share_at(points), float(task.costs.bytes[i]),
                            float(lookups[i]), float(touch[i]), float(per_lookup[i]),
                            float(fixed[i]), cap_us)
        for at in reversed(cuts):
            parts = parts.split(i, at, by_heat=True)
        if cuts:
            hot.append(i)
    mask = np.zeros(parts.size, dtype=bool)
    mask[hot] = True
    return parts, mask


def with_main_cache(task: ServingTask, mapping: Mapping) -> Mapping:
    """``mapping`` with the hottest rows of remote tables moved to the main server, within its
    memory less headroom (unchanged when it has no room or no remote table)."""
    parts = mapping.part_set(task.model.num_tables)
    costs = task.costs_for(parts)
    spare = task.profile.usable_main_bytes - float(costs.bytes[mapping.array == MAIN].sum())
    whole = (np.array(parts.lo) == 0) & (np.array(parts.hi) == 1)
    eligible = np.flatnonzero((mapping.array != MAIN) & (np.array(parts.lo) == 0)
                              & (whole | np.array(parts.by_heat)))
    if spare <= 0 or not eligible.size:
        return mapping
    _, lookups = parts.touch(task.model)
    gains, sizes, owner, ends = [], [], [], []
    for i in eligible:
        hi = parts.hi[i]
        grid = np.r_[GRID[(GRID > 0) & (hi > GRID)], hi]
        curve = task.model.tables[parts.table[i]].access_curve()
        share = np.r_[0.0, curve.share_at(grid)]
        bytes_per = float(costs.bytes[i]) / hi
        gains.append(np.diff(share) * lookups[i] * costs.touch_p[i])
        sizes.append(np.diff(np.r_[0.0, grid]) * bytes_per)
        owner.append(np.full(grid.size, i))
        ends.append(grid)
    gain, size = np.concatenate(gains), np.concatenate(sizes)
    who, end = np.concatenate(owner), np.concatenate(ends)
    order = np.argsort(-gain / np.maximum(size, 1e-9), kind="stable")
    taken = np.cumsum(size[order]) <= spare
    cut: dict[int, float] = {}
    for j in order[taken]:
        cut[int(who[j])] = max(cut.get(int(who[j]), 0.0), float(end[j]))
    assign = list(mapping.assign)
    for k, at in sorted(cut.items()):
        if at >= parts.hi[k] - 1e-12:
            assign[k] = MAIN
            continue
        parts = parts.split(k, at, by_heat=True)
        assign.append(assign[k])
        assign[k] = MAIN
    return Mapping(mapping.servers, tuple(assign), mapping.strategy,
                   (mapping.note + "; " if mapping.note else "") + f"hot rows of {len(cut)} "
                   "tables on the main server", parts, mapping.replicas, mapping.main_replicas)

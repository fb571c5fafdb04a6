"""Plans: where every table's shards live and how many of their hottest rows stay in HBM.

A table is placed whole, on one device with its hottest ``hbm_rows`` in HBM, or split into
shards of one :class:`autoshard.layout.kinds.ShardingKind` (row ranges, column blocks, or both:
``grid_shard`` rectangles), each on its device with its own hottest ``hbm_rows`` in HBM. This
module owns the plan file's schema.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError, PlannerError, gib
from autoshard.fileio import (
    PLAN_SCHEMA_VERSION,
    SCHEMA_VERSION,
    check_schema,
    read_structured,
    write_structured,
)
from autoshard.layout.kinds import WHOLE, ShardingKind
from autoshard.layout.plan_context import PlanContext
from autoshard.provenance import Provenance
from autoshard.task import ShardingTask, Workload

#: The schema of a plan that records its context (version 1: whole tables, 2: split ones).
CONTEXT_SCHEMA_VERSION = 3


@dataclass(frozen=True)
class Shard:
    """One piece of a split table: rows ``[row_start, row_end)`` and columns
    ``[col_start, col_end)`` on ``device``, with its ``hbm_rows`` hottest rows in HBM."""

    device: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int
    hbm_rows: int

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def cols(self) -> int:
        return self.col_end - self.col_start


@dataclass(frozen=True)
class Placement:
    """Where one table lives.

    Args:
        table: The table's name.
        device: Its rank when whole; for a split table, the first shard's rank.
        hbm_rows: Its hottest rows in HBM when whole; for a split table, the sum over its
            shards.
        sharding: How it is split (:data:`autoshard.layout.kinds.WHOLE`: placed whole); a kind's
            name is read as that kind.
        shards: The shards of a split table, in row (or column) order, a grid's block-major
            (by column block, then rows); empty when whole.
    """

    table: str
    device: int
    hbm_rows: int
    sharding: ShardingKind = WHOLE
    shards: tuple[Shard, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.sharding, ShardingKind):  # a kind's name, as plan files give it
            object.__setattr__(self, "sharding", ShardingKind.parse(self.sharding))

    @classmethod
    def split(cls, table: str, sharding: ShardingKind | str, shards: tuple[Shard, ...]
              ) -> Placement:
        """A split placement; ``device`` and ``hbm_rows`` are derived from the shards."""
        kind = sharding if isinstance(sharding, ShardingKind) else ShardingKind.parse(sharding)
        return cls(table, shards[0].device, sum(s.hbm_rows for s in shards), kind, shards)

    @property
    def is_split(self) -> bool:
        return self.sharding.is_split

    def pieces(self, rows: int, dim: int) -> tuple[Shard, ...]:
        """Its shards; a whole table is one shard of every row and column."""
        if not self.is_split:
            return (Shard(self.device, 0, rows, 0, dim, self.hbm_rows),)
        return self.shards


def check_placement(p: Placement, where: str, source: str | None = None,
                    rows: int | None = None, dim: int | None = None) -> None:
    """Checks a placement's sharding and shard ranges (against the table's ``rows`` and ``dim``
    when given).

    Raises:
        InputError: Naming the field, e.g. ``placements[3].shards[1].cols``, and the value.
    """
    def bad(field: str, message: str, value: object) -> InputError:
        return InputError(message, source=source, field=f"{where}.{field}", value=value)

    if not isinstance(p.sharding, ShardingKind):
        raise bad("sharding", "must be a sharding kind", p.sharding)
    if not p.is_split:
        if p.shards:
            raise bad("shards", "a whole-table placement lists no shards", len(p.shards))
        if rows is not None and p.hbm_rows > rows:
            raise bad("hbm_rows", f"more than the table's {rows} rows", p.hbm_rows)
        return
    if not p.shards:
        raise bad("shards", f"a {p.sharding.value} placement needs at least one shard", [])
    if p.sharding.replicated:
        _check_replicas(p, rows, dim, bad)
        return
    if p.sharding.splits_rows and p.sharding.splits_cols:
        _check_grid(p, rows, dim, bad)
        return
    by_rows = p.sharding.splits_rows
    split_name = "rows" if by_rows else "cols"
    extent = rows if by_rows else dim
    full = dim if by_rows else rows
    first = p.shards[0]
    want_full = (0, full if full is not None
                 else (first.col_end if by_rows else first.row_end))
    edge = 0
    for j, s in enumerate(p.shards):
        edge = _check_shard(p, j, s, edge, extent, want_full, bad)
    if extent is not None and edge != extent:
        raise bad(f"shards[{len(p.shards) - 1}].{split_name}",
                  f"shards end at {edge} but the table has {extent} {split_name}", edge)


@dataclass(frozen=True)
class Plan:
    """A complete placement of a task's tables.

    Args:
        placements: One placement per table.
        sharder: Name of the sharder that produced it.
        workload: The workload it was planned for, if recorded.
        hardware: Name of the hardware profile it was planned for, if recorded.
        provenance: How the sharder found it (which candidate won, what each search step
            added), if it records that.
        context: What it was made for (tables, hardware, workload, reservation, cost model:
            :class:`autoshard.layout.plan_context.PlanContext`), as the command line records it;
            None in plans of earlier schemas and those made in Python without it.
    """

    placements: tuple[Placement, ...]
    sharder: str = ""
    workload: Workload | None = None
    hardware: str | None = None
    provenance: Provenance | None = None
    context: PlanContext | None = None

    @classmethod
    def from_arrays(cls, task: ShardingTask, device: np.ndarray, hbm_rows: np.ndarray,
                    sharder: str = "") -> Plan:
        """A plan from per-table arrays in task order."""
        placements = tuple(Placement(t.name, int(d), int(k))
                           for t, d, k in zip(task.tables, device, hbm_rows, strict=True))
        return cls(placements, sharder, task.workload, task.hardware.name)

    @property
    def is_split(self) -> bool:
        """Whether any table is split into shards."""
        return any(p.is_split for p in self.placements)

    def sharding_counts(self) -> dict[str, int]:
        """Tables per sharding kind, by kind name (sorted)."""
        counts: dict[str, int] = {}
        for p in self.placements:
            counts[p.sharding.value] = counts.get(p.sharding.value, 0) + 1
        return dict(sorted(counts.items()))

    def arrays(self, task: ShardingTask) -> tuple[np.ndarray, np.ndarray]:
        """(device, hbm_rows) in task order; checks every table is placed exactly once.

        Raises:
            PlannerError: A table is unknown, placed twice or unplaced, or split into shards
                (read those with :func:`autoshard.layout.shards.plan_layout`).
        """
        split = next((p for p in self.placements if p.is_split), None)
        if split is not None:
            raise PlannerError("invalid_plan", f"table '{split.table}' is split "
                               f"({split.sharding.value}); this step places whole tables only")
        device = np.zeros(task.num_tables, dtype=np.int64)
        hbm = np.zeros(task.num_tables, dtype=np.int64)
        placed = np.zeros(task.num_tables, dtype=bool)
        for p in self.placements:
            i = task.index.get(p.table)
            if i is None:
                raise PlannerError("invalid_plan", f"plan places unknown table '{p.table}'")
            if placed[i]:
                raise PlannerError("invalid_plan", f"table '{p.table}' is placed twice")
            placed[i] = True
            device[i] = p.device
            hbm[i] = p.hbm_rows
        missing = [task.tables[i].name for i in np.flatnonzero(~placed)]
        if missing:
            raise PlannerError("invalid_plan", f"plan leaves {len(missing)} table(s) unplaced, "
                               f"first '{missing[0]}'")
        return device, hbm

    def to_dict(self) -> dict[str, Any]:
        """The plan document: schema version 3 when it records its context, else 2 when a table
        is split, else 1 (which older readers also load)."""
        version = (CONTEXT_SCHEMA_VERSION if self.context is not None
                   else PLAN_SCHEMA_VERSION if self.is_split else SCHEMA_VERSION)
        doc: dict[str, Any] = {"schema_version": version, "kind": "plan",
                               "sharder": self.sharder, "hardware": self.hardware}
        if self.context is not None:
            doc["context"] = self.context.to_dict()
        if self.workload is not None:
            doc["workload"] = {"batch_size": self.workload.batch_size,
                               "mode": self.workload.mode}
        if self.provenance is not None:
            doc["provenance"] = self.provenance.to_dict()
        doc["placements"] = [_placement_doc(p) for p in self.placements]
        return doc

    @classmethod
    def from_dict(cls, doc: Any, source: str = "<plan>") -> Plan:
        doc = check_schema(doc, "plan", source,
                           (SCHEMA_VERSION, PLAN_SCHEMA_VERSION, CONTEXT_SCHEMA_VERSION))
        if not isinstance(doc.get("placements"), list):
            raise InputError("required list missing", source=source, field="placements")
        placements = tuple(_placement_from(p, f"placements[{i}]", source)
                           for i, p in enumerate(doc["placements"]))
        if doc.get("hardware") is not None and not isinstance(doc["hardware"], str):
            raise InputError("must be a profile name", source=source, field="hardware",
                             value=doc["hardware"])
        workload = (None if doc.get("workload") is None
                    else Workload.from_dict(doc["workload"], source))
        provenance = (None if doc.get("provenance") is None
                      else Provenance.from_dict(doc["provenance"], source))
        context = (None if doc.get("context") is None
                   else PlanContext.from_dict(doc["context"], source))
        return cls(placements, str(doc.get("sharder", "")), workload, doc.get("hardware"),
                   provenance, context)

    def save(self, path: str | Path) -> None:
        write_structured(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.from_dict(read_structured(path), source=str(path))


def _placement_doc(p: Placement) -> dict[str, Any]:
    if not p.is_split:
        return {"table": p.table, "device": p.device, "hbm_rows": p.hbm_rows}
    return {"table": p.table, "sharding": p.sharding.value,
            "shards": [{"device": s.device, "rows": [s.row_start, s.row_end],
                        "cols": [s.col_start, s.col_end], "hbm_rows": s.hbm_rows}
                       for s in p.shards]}


def _count(value: Any, source: str, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError("must be an integer >= 0", source=source, field=field, value=value)
    return value


def _required(doc: Any, keys: tuple[str, ...], source: str, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise InputError("expected a mapping", source=source, field=where, value=doc)
    for key in keys:
        if key not in doc:
            raise InputError("required field missing", source=source, field=f"{where}.{key}")
    return doc


def _range(value: Any, source: str, field: str) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise InputError("expected [start, end]", source=source, field=field, value=value)
    return _count(value[0], source, field), _count(value[1], source, field)


def _placement_from(p: Any, where: str, source: str) -> Placement:
    """One placement entry of a plan document: ``{table, device, hbm_rows}`` or ``{table,
    sharding, shards: [{device, rows: [start, end], cols: [start, end], hbm_rows}]}``."""
    split = isinstance(p, dict) and ("shards" in p or p.get("sharding", WHOLE.value) != WHOLE.value)
    if not split:
        p = _required(p, ("table", "device", "hbm_rows"), source, where)
        placement = Placement(str(p["table"]), _count(p["device"], source, f"{where}.device"),
                              _count(p["hbm_rows"], source, f"{where}.hbm_rows"))
        check_placement(placement, where, source)
        return placement
    p = _required(p, ("table", "sharding", "shards"), source, where)
    kind = ShardingKind.parse(p["sharding"], f"{where}.sharding", source)
    if not kind.is_split or not isinstance(p["shards"], list) or not p["shards"]:
        raise InputError(f"a split placement lists its shards (a {WHOLE.value} one gives "
                         "device and hbm_rows instead)", source=source, field=f"{where}.shards",
                         value=p["shards"])
    shards = []
    for j, s in enumerate(p["shards"]):
        at = f"{where}.shards[{j}]"
        s = _required(s, ("device", "rows", "cols", "hbm_rows"), source, at)
        rows = _range(s["rows"], source, f"{at}.rows")
        cols = _range(s["cols"], source, f"{at}.cols")
        shards.append(Shard(_count(s["device"], source, f"{at}.device"), *rows, *cols,
                            _count(s["hbm_rows"], source, f"{at}.hbm_rows")))
    placement = Placement.split(str(p["table"]), kind, tuple(shards))
    check_placement(placement, where, source)
    return placement


def _check_replicas(p: Placement, rows: int | None, dim: int | None,
                    bad: Callable[[str, str, object], InputError]) -> None:
    """Checks a replicated placement: every shard holds the whole table, all of it in HBM,
    on a device of its own (that they cover the world is checked against the hardware)."""
    first = p.shards[0]
    whole = ([0, rows if rows is not None else first.row_end],
             [0, dim if dim is not None else first.col_end])
    seen: set[int] = set()
    for j, s in enumerate(p.shards):
        for name, got, want in (("rows", [s.row_start, s.row_end], whole[0]),
                                ("cols", [s.col_start, s.col_end], whole[1])):
            if got != want:
                raise bad(f"shards[{j}].{name}", f"a {p.sharding.value} replica holds the "
                          f"whole table, {want}", got)
        if s.hbm_rows != s.rows:
            raise bad(f"shards[{j}].hbm_rows", f"a {p.sharding.value} replica keeps all its "
                      f"{s.rows} rows in HBM", s.hbm_rows)
        if s.device < 0 or s.device in seen:
            raise bad(f"shards[{j}].device", "must be an integer >= 0, one replica per device",
                      s.device)
        seen.add(s.device)


def _check_grid(p: Placement, rows: int | None, dim: int | None,
                bad: Callable[[str, str, object], InputError]) -> None:
    """Checks a grid placement, its shards listed block-major: column blocks in column order
    covering the columns without gap or overlap, each block's row shards in row order covering
    the rows (without ``rows``: the rows the first block covers)."""
    shards, j, col_edge, first = p.shards, 0, 0, None
    while j < len(shards):
        block = (shards[j].col_start, shards[j].col_end)
        if block[0] != col_edge:
            raise bad(f"shards[{j}].cols", f"must start at {col_edge}, where the previous "
                      "column block ends (blocks in column order, each block's row shards "
                      "together, without overlap or gap)", list(block))
        if dim is not None and block[1] > dim:
            raise bad(f"shards[{j}].cols", f"ends at {block[1]} but the table has {dim} cols",
                      block[1])
        edge = 0
        while j < len(shards) and (shards[j].col_start, shards[j].col_end) == block:
            edge = _check_shard(p, j, shards[j], edge, rows, block, bad,
                                "the columns of its block")
            j += 1
        if (rows if rows is not None else first) not in (None, edge):
            whole = (f"the table has {rows} rows" if rows is not None else
                     f"the first block at row {first} (every block covers the rows)")
            raise bad(f"shards[{j - 1}].rows", f"column block {list(block)} ends at row {edge} "
                      f"but {whole}", edge)
        first, col_edge = edge if first is None else first, block[1]
    if dim is not None and col_edge != dim:
        raise bad(f"shards[{len(shards) - 1}].cols", f"column blocks end at {col_edge} but the "
                  f"table has {dim} cols", col_edge)


def _check_shard(p: Placement, j: int, s: Shard, edge: int, extent: int | None,
                 want_full: tuple[int, int], bad: Callable[[str, str, object], InputError],
                 across: str | None = None) -> int:
    """Checks shard ``j`` of a split placement, which must start at ``edge`` and hold
    ``want_full`` across (``across`` says what that is; default every column, or row);
    returns where it ends (see :func:`check_placement`)."""
    by_rows = p.sharding.splits_rows
    split_name, full_name = ("rows", "cols") if by_rows else ("cols", "rows")
    for name, (lo, hi) in (("rows", (s.row_start, s.row_end)), ("cols", (s.col_start, s.col_end))):
        if lo < 0 or hi <= lo:
            raise bad(f"shards[{j}].{name}", "needs 0 <= start < end (no empty shard)", [lo, hi])
    split_range = (s.row_start, s.row_end) if by_rows else (s.col_start, s.col_end)
    full_range = (s.col_start, s.col_end) if by_rows else (s.row_start, s.row_end)
    if split_range[0] != edge:
        raise bad(f"shards[{j}].{split_name}", f"must start at {edge}, where the previous shard "
                  "ends (shards are listed in order, without overlap or gap)", list(split_range))
    end = split_range[1]
    if extent is not None and end > extent:
        raise bad(f"shards[{j}].{split_name}", f"ends at {end} but the table has {extent} "
                  f"{split_name}", end)
    if full_range != want_full:
        holds = across or f"every {'column' if by_rows else 'row'}"
        raise bad(f"shards[{j}].{full_name}", f"a {p.sharding.value} shard holds {holds}, "
                  f"{list(want_full)}", list(full_range))
    if s.device < 0:
        raise bad(f"shards[{j}].device", "must be an integer >= 0", s.device)
    if not 0 <= s.hbm_rows <= s.rows:
        raise bad(f"shards[{j}].hbm_rows", f"must be in [0, {s.rows}], the shard's rows",
                  s.hbm_rows)
    return end


def check_devices(p: Placement, pieces: tuple[Shard, ...], where: str, source: str | None,
                  node: np.ndarray, hardware: str) -> None:
    """Checks a placement's devices on hardware whose device i lies on node ``node[i]``: every
    device exists; a replicated table has one replica on each device; a node-local kind's
    column blocks (a table-row-wise table's one) each lie on one node, and where the kind
    fills nodes one shard per device.

    Raises:
        InputError: Naming the field (e.g. ``placements[3].shards[1].device``) and the value.
    """
    n, kind = node.size, p.sharding
    for j, s in enumerate(pieces):
        if s.device >= n:
            field = f"{where}.device" if not p.is_split else f"{where}.shards[{j}].device"
            raise InputError(f"device {s.device} of {n}: the hardware '{hardware}' has "
                             f"devices 0..{n - 1}", source=source, field=field, value=s.device)
    if kind.replicated and sorted(s.device for s in pieces) != list(range(n)):
        raise InputError(f"{kind.value} places one replica on each of the {n} devices",
                         source=source, field=f"{where}.shards", value=[s.device for s in pieces])
    blocks: dict[tuple[int, int], list[int]] = {}
    for s in pieces if kind.node_local else ():
        blocks.setdefault((s.col_start, s.col_end), []).append(s.device)
    for cols, devices in blocks.items():
        what = f"shards of column block {list(cols)}" if kind.splits_cols else "shards"
        nodes = sorted({int(node[d]) for d in devices})
        if len(nodes) > 1:
            raise InputError(f"{kind.value} {what} all live on one node", source=source,
                             field=f"{where}.shards", value=nodes)
        if kind.fills_node and len(set(devices)) < len(devices):
            raise InputError(f"{kind.value} {what} go one per device of their node",
                             source=source, field=f"{where}.shards", value=devices)


def memory_use(task: ShardingTask, device: np.ndarray,
               hbm_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bytes used per device in (HBM, host), optimizer state included in train mode."""
    a = task.table_arrays
    per_row = a.memory_bytes_per_row
    d = task.num_devices
    hbm = np.bincount(device, weights=hbm_rows * per_row, minlength=d)
    host = np.bincount(device, weights=(a.rows - hbm_rows) * per_row, minlength=d)
    return hbm, host


def hbm_use(task: ShardingTask, device: np.ndarray, hbm_rows: np.ndarray) -> np.ndarray:
    """HBM bytes per device as the runtime counts them: every table's (or, on a shard task,
    shard's) HBM rows and reservation (:meth:`autoshard.task.TableArrays.hbm_bytes`), what
    the sharders keep within each device's HBM."""
    weights = task.table_arrays.hbm_bytes(slice(None), hbm_rows)
    return np.bincount(device, weights=weights, minlength=task.num_devices)


def check_plan(plan: Plan, task: ShardingTask) -> tuple[np.ndarray, np.ndarray]:
    """Validates a plan against a task; returns its (device, hbm_rows) arrays.

    Raises:
        PlannerError: A table is missing, doubled or unknown, a device or row count is out of
            range, or a tier is over capacity (the message names the device and the bytes).
    """
    device, hbm = plan.arrays(task)
    a = task.table_arrays
    bad = (device < 0) | (device >= task.num_devices) | (hbm < 0) | (hbm > a.rows)
    for i in np.flatnonzero(bad):
        t = task.tables[i]
        where = next(j for j, p in enumerate(plan.placements) if p.table == t.name)
        field = "device" if not 0 <= device[i] < task.num_devices else "hbm_rows"
        raise PlannerError("invalid_plan", f"field 'placements[{where}].{field}': table "
                           f"'{t.name}': device {device[i]} of {task.num_devices} on hardware "
                           f"'{task.hardware.name}', hbm_rows {hbm[i]} of {t.rows}")
    used_hbm, used_host = memory_use(task, device, hbm)
    dev = task.device_arrays
    for tier, used, cap in (("HBM", used_hbm, dev.hbm_capacity),
                            ("host", used_host, dev.host_capacity)):
        over = np.flatnonzero(used > cap)
        if over.size:
            d = int(over[0])
            names = [task.tables[i].name for i in np.flatnonzero(device == d)][:5]
            raise PlannerError("capacity", f"device {d} {tier} holds {gib(used[d])} but has "
                               f"{gib(cap[d])} (tables {', '.join(names)}...)")
    return device, hbm

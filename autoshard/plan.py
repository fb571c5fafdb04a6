"""Plans: for every table, a device and how many of its hottest rows stay in HBM."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError, PlannerError, gib
from autoshard.fileio import SCHEMA_VERSION, check_schema, read_structured, write_structured
from autoshard.task import ShardingTask, Workload


@dataclass(frozen=True)
class Placement:
    """Where one table lives: ``device`` (rank) and its ``hbm_rows`` hottest rows in HBM."""

    table: str
    device: int
    hbm_rows: int


@dataclass(frozen=True)
class Plan:
    """A complete placement of a task's tables.

    Args:
        placements: One placement per table.
        sharder: Name of the sharder that produced it.
        workload: The workload it was planned for, if recorded.
        hardware: Name of the hardware profile it was planned for, if recorded.
    """

    placements: tuple[Placement, ...]
    sharder: str = ""
    workload: Workload | None = None
    hardware: str | None = None

    @classmethod
    def from_arrays(cls, task: ShardingTask, device: np.ndarray, hbm_rows: np.ndarray,
                    sharder: str = "") -> Plan:
        """A plan from per-table arrays in task order."""
        placements = tuple(Placement(t.name, int(d), int(k))
                           for t, d, k in zip(task.tables, device, hbm_rows, strict=True))
        return cls(placements, sharder, task.workload, task.hardware.name)

    def arrays(self, task: ShardingTask) -> tuple[np.ndarray, np.ndarray]:
        """(device, hbm_rows) in task order; checks every table is placed exactly once."""
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
        doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "kind": "plan",
                               "sharder": self.sharder, "hardware": self.hardware}
        if self.workload is not None:
            doc["workload"] = {"batch_size": self.workload.batch_size,
                               "mode": self.workload.mode}
        doc["placements"] = [{"table": p.table, "device": p.device, "hbm_rows": p.hbm_rows}
                             for p in self.placements]
        return doc

    @classmethod
    def from_dict(cls, doc: Any, source: str = "<plan>") -> Plan:
        doc = check_schema(doc, "plan", source)
        if not isinstance(doc.get("placements"), list):
            raise InputError("required list missing", source=source, field="placements")
        placements = []
        for i, p in enumerate(doc["placements"]):
            where = f"placements[{i}]"
            if not isinstance(p, dict):
                raise InputError("expected a mapping", source=source, field=where, value=p)
            for key in ("table", "device", "hbm_rows"):
                if key not in p:
                    raise InputError("required field missing", source=source,
                                     field=f"{where}.{key}")
            for key in ("device", "hbm_rows"):
                if not isinstance(p[key], int) or isinstance(p[key], bool) or p[key] < 0:
                    raise InputError("must be an integer >= 0", source=source,
                                     field=f"{where}.{key}", value=p[key])
            placements.append(Placement(str(p["table"]), p["device"], p["hbm_rows"]))
        if doc.get("hardware") is not None and not isinstance(doc["hardware"], str):
            raise InputError("must be a profile name", source=source, field="hardware",
                             value=doc["hardware"])
        workload = None
        if doc.get("workload") is not None:
            if not isinstance(doc["workload"], dict):
                raise InputError("expected a mapping", source=source, field="workload",
                                 value=doc["workload"])
            try:
                workload = Workload(**doc["workload"])
            except InputError as exc:
                raise exc.located(source, "workload") from exc
            except TypeError as exc:
                raise InputError("expected only batch_size and mode", source=source,
                                 field="workload", value=doc["workload"]) from exc
        return cls(tuple(placements), str(doc.get("sharder", "")), workload, doc.get("hardware"))

    def save(self, path: str | Path) -> None:
        write_structured(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.from_dict(read_structured(path), source=str(path))


def memory_use(task: ShardingTask, device: np.ndarray,
               hbm_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bytes used per device in (HBM, host), optimizer state included in train mode."""
    a = task.table_arrays
    per_row = a.memory_bytes_per_row
    d = task.num_devices
    hbm = np.bincount(device, weights=hbm_rows * per_row, minlength=d)
    host = np.bincount(device, weights=(a.rows - hbm_rows) * per_row, minlength=d)
    return hbm, host


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
        raise PlannerError("invalid_plan", f"table '{t.name}': device {device[i]} of "
                           f"{task.num_devices}, hbm_rows {hbm[i]} of {t.rows}")
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

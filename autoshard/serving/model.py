"""A served model: embedding tables with per-request behaviour, and feature groups.

A request scores ``items`` candidates. Tables belong to feature groups (sub-networks a request
uses together): a request touches group ``g`` with probability ``p_g`` (the largest coverage of
its tables) and, given that, each table of the group with probability ``coverage / p_g``, so a
table's marginal touch probability is its measured coverage (:class:`autoshard.tables.Table`)
while tables of one group are touched together. A touched table costs ``pooling_factor``
lookups per request, times ``items`` for item-side tables (``per_item``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError
from autoshard.fileio import SCHEMA_VERSION, check_schema, read_structured, write_structured
from autoshard.serving.profile import ServingProfile
from autoshard.tables import Table, check_unique_names, load_tables

INDEX_BYTES = 8  # an int64 row index sent per lookup


@dataclass(frozen=True)
class ServingModel:
    """Tables plus how requests use them.

    Args:
        name: Model name.
        tables: The embedding tables (with their statistics).
        items: Candidates scored per request.
        group: Feature-group index of each table.
        group_names: Name of each feature group.
        per_item: Whether each table is looked up once per item (item-side features) rather than
            once per request (user-side features).
    """

    name: str
    tables: tuple[Table, ...]
    items: int
    group: tuple[int, ...]
    group_names: tuple[str, ...]
    per_item: tuple[bool, ...]

    def __post_init__(self) -> None:
        if not self.tables:
            raise InputError("a served model needs at least one table", field="tables", value=0)
        if not (isinstance(self.items, int) and 1 <= self.items <= 1_000_000):
            raise InputError("must be an integer in [1, 1000000]", field="items",
                             value=self.items)
        n = len(self.tables)
        if len(self.group) != n or len(self.per_item) != n:
            raise InputError("one group and one per_item flag per table", field="group",
                             value=(len(self.group), len(self.per_item), n))
        if any(not 0 <= g < len(self.group_names) for g in self.group):
            raise InputError("group index out of range", field="group", value=max(self.group))

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    def table_bytes(self) -> np.ndarray:
        """Bytes each table occupies for serving (weights only)."""
        return np.array([t.rows * t.memory_bytes_per_row(False) for t in self.tables], float)

    def group_touch(self) -> np.ndarray:
        """Probability a request touches each feature group."""
        cov = np.array([t.coverage for t in self.tables])
        out = np.zeros(len(self.group_names))
        np.maximum.at(out, np.asarray(self.group), cov)
        return out

    def conditional_touch(self) -> np.ndarray:
        """Probability a request touches each table, given it touches the table's group."""
        cov = np.array([t.coverage for t in self.tables])
        return np.minimum(cov / self.group_touch()[np.asarray(self.group)], 1.0)

    def lookups(self) -> np.ndarray:
        """Lookups per request that touches the table."""
        mult = np.where(np.asarray(self.per_item), self.items, 1)
        return np.array([t.pooling_factor for t in self.tables]) * mult

    def to_dict(self) -> dict[str, Any]:
        groups: dict[str, list[str]] = {g: [] for g in self.group_names}
        for t, g in zip(self.tables, self.group, strict=True):
            groups[self.group_names[g]].append(t.name)
        return {"schema_version": SCHEMA_VERSION, "kind": "serving_model", "name": self.name,
                "items": self.items, "groups": groups,
                "per_item": [t.name for t, p in zip(self.tables, self.per_item, strict=True)
                             if p],
                "tables": [t.to_dict() for t in self.tables]}


@dataclass(frozen=True)
class TableCosts:
    """Per-table serving costs of a model on a profile (all arrays of length ``tables``).

    Args:
        bytes: Memory per table, bytes.
        work_us: CPU time of a touched table's lookups (with its fixed overhead), microseconds.
        transfer_us: Remote-call cost of a touched table: its indices and pooled results over
            the network, plus the per-table call overhead, microseconds (not paid on the main
            server).
        group_p: Touch probability per group; table_p: conditional touch probability per table;
        group: Group index per table.
    """

    bytes: np.ndarray
    work_us: np.ndarray
    transfer_us: np.ndarray
    group_p: np.ndarray
    table_p: np.ndarray
    group: np.ndarray

    @property
    def expected_us(self) -> np.ndarray:
        """Expected work plus transfer per request (touch probability times cost)."""
        return (self.work_us + self.transfer_us) * self.table_p * self.group_p[self.group]


def table_costs(model: ServingModel, profile: ServingProfile) -> TableCosts:
    """Prices every table's lookups and transfers on ``profile``."""
    lookups = model.lookups()
    row_bytes = np.array([t.row_bytes for t in model.tables], float)
    work = (lookups * (profile.lookup_ns + row_bytes / profile.memory_bandwidth_gbps) / 1e3
            + profile.table_overhead_us)
    out_rows = np.where(np.asarray(model.per_item), model.items, 1)
    wire = lookups * INDEX_BYTES + out_rows * row_bytes
    return TableCosts(bytes=model.table_bytes(), work_us=work,
                      transfer_us=wire / (profile.network_gbps * 1e3)
                      + profile.call_table_overhead_us,
                      group_p=model.group_touch(), table_p=model.conditional_touch(),
                      group=np.asarray(model.group))


def build_model(name: str, tables: Sequence[Table], items: int,
                groups: Mapping[str, Sequence[str]] | None = None,
                per_item: Sequence[str] = (), source: str = "<serving model>") -> ServingModel:
    """A model from tables, group membership by table name and item-side table names.

    Tables in no group form a group of their own.
    """
    tables = tuple(tables)
    check_unique_names(tables, source)
    index = {t.name: i for i, t in enumerate(tables)}
    group = [-1] * len(tables)
    names: list[str] = []
    for gname, members in (groups or {}).items():
        if not isinstance(members, (list, tuple)):
            raise InputError("expected a list of table names", source=source,
                             field=f"groups.{gname}", value=members)
        for member in members:
            if member not in index:
                raise InputError("unknown table", source=source, field=f"groups.{gname}",
                                 value=member)
            if group[index[member]] != -1:
                raise InputError("table in two groups", source=source, field=f"groups.{gname}",
                                 value=member)
            group[index[member]] = len(names)
        names.append(str(gname))
    for i, g in enumerate(group):
        if g == -1:
            group[i] = len(names)
            names.append(tables[i].name)
    for member in per_item:
        if member not in index:
            raise InputError("unknown table", source=source, field="per_item", value=member)
    flags = tuple(t.name in set(per_item) for t in tables)
    try:
        return ServingModel(name, tables, items, tuple(group), tuple(names), flags)
    except InputError as exc:
        raise exc.located(source) from exc


def load_model(path: str | Path) -> ServingModel:
    """Reads a serving model file (``kind: serving_model``; ``tables`` inline or a table file)."""
    source = str(path)
    doc = check_schema(read_structured(path), "serving_model", source)
    for key in ("items", "tables"):
        if key not in doc:
            raise InputError("required field missing", source=source, field=key)
    known = {"schema_version", "kind", "name", "items", "tables", "groups", "per_item"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise InputError(f"unknown field (known: {', '.join(sorted(known))})", source=source,
                         field=unknown[0])
    items = doc["items"]
    if isinstance(items, bool) or not isinstance(items, int):
        raise InputError("must be an integer", source=source, field="items", value=items)
    spec = doc["tables"]
    if isinstance(spec, str):
        tables = load_tables(Path(source).parent / spec)
    elif isinstance(spec, list) and spec:
        tables = tuple(Table.from_dict(d, source, i) for i, d in enumerate(spec))
    else:
        raise InputError("expected a table file or a non-empty list", source=source,
                         field="tables", value=spec)
    groups = doc.get("groups") or {}
    if not isinstance(groups, dict):
        raise InputError("expected a mapping of group name to table names", source=source,
                         field="groups", value=groups)
    per_item = doc.get("per_item") or []
    if not isinstance(per_item, list):
        raise InputError("expected a list of table names", source=source, field="per_item",
                         value=per_item)
    return build_model(str(doc.get("name", Path(source).stem)), tables, items, groups,
                       per_item, source)


def save_model(path: str | Path, model: ServingModel) -> None:
    write_structured(path, model.to_dict())

"""A served model: embedding tables with per-request behaviour, and feature groups.

A request scores ``items`` candidates on average; the count varies from request to request by
a mean-1 lognormal factor of spread ``items_sigma`` (DeepRecSys: production query sizes are
heavy-tailed), scaling item-side lookups and dense compute. ``dense_overlap`` is the share of
the dense part that runs while the remote lookups are in flight (a bottom MLP over dense
features needs no embedding). Tables belong to feature groups (sub-networks a request
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
from autoshard.limits import Range
from autoshard.tables import Table, check_unique_names, load_tables

INDEX_BYTES = 8  # an int64 row index sent per lookup
#: Spread of items per request (sigma of log): 2 already puts the P99 request at 100x the median.
ITEMS_SIGMA = Range(0, 2)
#: A share in [0, 1].
SHARE = Range(0, 1)


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
        items_sigma: Spread (sigma of log) of the items per request around ``items``; 0 fixes
            every request at ``items``.
        dense_overlap: Share of the dense compute that overlaps the remote lookups.
    """

    name: str
    tables: tuple[Table, ...]
    items: int
    group: tuple[int, ...]
    group_names: tuple[str, ...]
    per_item: tuple[bool, ...]
    items_sigma: float = 0.0
    dense_overlap: float = 0.0

    def __post_init__(self) -> None:
        ITEMS_SIGMA.check(self.items_sigma, "items_sigma")
        SHARE.check(self.dense_overlap, "dense_overlap")
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
                "items": self.items, "items_sigma": self.items_sigma,
                "dense_overlap": self.dense_overlap, "groups": groups,
                "per_item": [t.name for t, p in zip(self.tables, self.per_item, strict=True)
                             if p],
                "tables": [t.to_dict() for t in self.tables]}


def build_model(name: str, tables: Sequence[Table], items: int,
                groups: Mapping[str, Sequence[str]] | None = None,
                per_item: Sequence[str] = (), source: str = "<serving model>",
                items_sigma: float = 0.0, dense_overlap: float = 0.0) -> ServingModel:
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
        return ServingModel(name, tables, items, tuple(group), tuple(names), flags,
                            items_sigma, dense_overlap)
    except InputError as exc:
        raise exc.located(source) from exc


def load_model(path: str | Path) -> ServingModel:
    """Reads a serving model file (``kind: serving_model``; ``tables`` inline or a table file)."""
    source = str(path)
    doc = check_schema(read_structured(path), "serving_model", source)
    for key in ("items", "tables"):
        if key not in doc:
            raise InputError("required field missing", source=source, field=key)
    known = {"schema_version", "kind", "name", "items", "tables", "groups", "per_item",
             "items_sigma", "dense_overlap"}
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
    extra = {}
    for key in ("items_sigma", "dense_overlap"):
        value = doc.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError("must be a number", source=source, field=key, value=value)
        extra[key] = float(value)
    return build_model(str(doc.get("name", Path(source).stem)), tables, items, groups,
                       per_item, source, **extra)


def save_model(path: str | Path, model: ServingModel) -> None:
    write_structured(path, model.to_dict())

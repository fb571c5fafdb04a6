"""Embedding tables and their statistics; table files in JSON, YAML or CSV."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autoshard.access import AccessCurve
from autoshard.errors import InputError
from autoshard.fileio import SCHEMA_VERSION, check_schema, read_structured, write_structured

#: Power-of-two reuse bins of DreamShard's features and Meta's locality stats: a row accessed
#: n times falls in bin 0 for n = 1, bin i for 2^(i-1) < n <= 2^i, bin 16 for n > 32768.
REUSE_BINS = 17


@dataclass(frozen=True)
class Table:
    """One embedding table with the statistics RecShard and DreamShard plan from.

    Args:
        name: Unique name.
        rows: Hash size (number of rows).
        dim: Embedding dimension (elements per row).
        bytes_per_element: 4 for fp32 (default), 2 for fp16.
        optimizer_bytes_per_row: Optimizer state per row in train mode; 4 bytes (one fp32 per
            row) is FBGEMM's row-wise Adagrad default.
        pooling_factor: Mean lookups per sample when the feature is present.
        pooling_std: Spread of lookups per sample (standard deviation), if measured.
        coverage: Share of samples in which the feature is present.
        rows_used: Distinct rows ever looked up, if measured.
        access_cdf: Measured share of lookups served by the hottest rows.
        zipf_alpha: Access skew assumed when no CDF is measured.
        reuse_hist: Share of distinct rows in each of the 17 reuse bins, if measured.
    """

    name: str
    rows: int
    dim: int
    bytes_per_element: int = 4
    optimizer_bytes_per_row: int = 4
    pooling_factor: float = 1.0
    pooling_std: float | None = None
    coverage: float = 1.0
    rows_used: int | None = None
    access_cdf: AccessCurve | None = None
    zipf_alpha: float | None = None
    reuse_hist: tuple[float, ...] | None = field(default=None)

    def __post_init__(self) -> None:
        checks: list[tuple[str, Any, bool]] = [
            ("name", self.name, isinstance(self.name, str) and bool(self.name)),
            ("rows", self.rows, _is_int(self.rows) and self.rows > 0),
            ("dim", self.dim, _is_int(self.dim) and self.dim > 0),
            ("bytes_per_element", self.bytes_per_element, self.bytes_per_element in (1, 2, 4, 8)),
            ("optimizer_bytes_per_row", self.optimizer_bytes_per_row,
             _is_int(self.optimizer_bytes_per_row) and self.optimizer_bytes_per_row >= 0),
            ("pooling_factor", self.pooling_factor, _finite(self.pooling_factor)
             and self.pooling_factor > 0),
            ("coverage", self.coverage, _finite(self.coverage) and 0 < self.coverage <= 1),
            ("rows_used", self.rows_used, self.rows_used is None
             or (_is_int(self.rows_used) and 0 < self.rows_used <= self.rows)),
            ("zipf_alpha", self.zipf_alpha, self.zipf_alpha is None
             or (_finite(self.zipf_alpha) and self.zipf_alpha >= 0)),
            ("reuse_hist", self.reuse_hist, self.reuse_hist is None
             or len(self.reuse_hist) == REUSE_BINS),
        ]
        for name, value, ok in checks:
            if not ok:
                raise InputError("invalid value", field=f"{self.name}.{name}", value=value)

    @property
    def row_bytes(self) -> int:
        """Bytes of one row's weights."""
        return self.dim * self.bytes_per_element

    def memory_bytes_per_row(self, train: bool) -> int:
        """Bytes one row occupies in a tier: weights, plus optimizer state in train mode."""
        return self.row_bytes + (self.optimizer_bytes_per_row if train else 0)

    @property
    def lookups_per_sample(self) -> float:
        """Mean lookups per sample: pooling factor times coverage."""
        return self.pooling_factor * self.coverage

    @property
    def access_source(self) -> str:
        """Which assumption the access curve rests on: measured, zipf, or uniform."""
        if self.access_cdf is not None:
            return "measured"
        return "zipf" if self.zipf_alpha is not None else "uniform"

    def access_curve(self) -> AccessCurve:
        """The measured curve, else a Zipf curve, else uniform over the used rows."""
        if self.access_cdf is not None:
            return self.access_cdf
        if self.zipf_alpha is not None:
            return AccessCurve.zipf(self.zipf_alpha, self.rows)
        used = (self.rows_used or self.rows) / self.rows
        return AccessCurve.uniform(used)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "rows": self.rows, "dim": self.dim}
        defaults = Table("x", 1, 1)
        for key in ("bytes_per_element", "optimizer_bytes_per_row", "pooling_factor",
                    "pooling_std", "coverage", "rows_used", "zipf_alpha"):
            value = getattr(self, key)
            if value != getattr(defaults, key):
                doc[key] = value
        if self.reuse_hist is not None:
            doc["reuse_hist"] = list(self.reuse_hist)
        if self.access_cdf is not None:
            doc["access_cdf"] = self.access_cdf.to_dict()
        return doc

    @classmethod
    def from_dict(cls, doc: Any, source: str = "<tables>", index: int = 0) -> Table:
        """Builds a table from a mapping; errors name the source, the table and the field."""
        where = f"tables[{index}]"
        if not isinstance(doc, dict):
            raise InputError("expected a mapping", source=source, field=where, value=doc)
        name = doc.get("name", where)
        for key in ("name", "rows", "dim"):
            if key not in doc or doc[key] in (None, ""):
                raise InputError("required field missing", source=source, field=f"{name}.{key}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(doc) - known)
        if unknown:
            raise InputError(f"unknown field (known: {', '.join(sorted(known))})",
                             source=source, field=f"{name}.{unknown[0]}")
        kwargs = dict(doc)
        try:
            for key in ("rows", "dim", "bytes_per_element", "optimizer_bytes_per_row",
                        "rows_used"):
                if kwargs.get(key) is not None:
                    kwargs[key] = _to_int(kwargs[key])
            for key in ("pooling_factor", "pooling_std", "coverage", "zipf_alpha"):
                if kwargs.get(key) is not None:
                    kwargs[key] = float(kwargs[key])
            if kwargs.get("access_cdf") is not None:
                kwargs["access_cdf"] = AccessCurve.from_dict(kwargs["access_cdf"])
            if kwargs.get("reuse_hist") is not None:
                kwargs["reuse_hist"] = tuple(float(v) for v in kwargs["reuse_hist"])
            return cls(**kwargs)
        except InputError as exc:
            raise exc.located(source, str(name)) from exc
        except (TypeError, ValueError, KeyError) as exc:
            bad = next((k for k, v in doc.items() if not _convertible(k, v)), "?")
            raise InputError(f"invalid value ({exc})", source=source, field=f"{name}.{bad}",
                             value=doc.get(bad)) from exc


def load_tables(path: str | Path) -> tuple[Table, ...]:
    """Reads a table file: JSON or YAML (``{"tables": [...]}`` or a list) or CSV (one row each)."""
    path = Path(path)
    source = str(path)
    if path.suffix.lower() == ".csv":
        docs = _read_csv(path)
    else:
        doc = read_structured(path)
        if isinstance(doc, dict):
            doc = check_schema(doc, "tables", source)
            if "tables" not in doc:
                raise InputError("required field missing", source=source, field="tables")
            doc = doc["tables"]
        if not isinstance(doc, list):
            raise InputError("expected a list of tables", source=source, field="tables")
        docs = doc
    if not docs:
        raise InputError("no tables", source=source, field="tables")
    tables = tuple(Table.from_dict(d, source, i) for i, d in enumerate(docs))
    check_unique_names(tables, source)
    return tables


def save_tables(path: str | Path, tables: Sequence[Table]) -> None:
    """Writes tables as JSON/YAML (by suffix) with the schema version, atomically."""
    write_structured(path, {"schema_version": SCHEMA_VERSION, "kind": "tables",
                            "tables": [t.to_dict() for t in tables]})


def check_unique_names(tables: Sequence[Table], source: str = "<tables>") -> None:
    seen: set[str] = set()
    for t in tables:
        if t.name in seen:
            raise InputError("duplicate table name", source=source, field="name", value=t.name)
        seen.add(t.name)


def with_stats(table: Table, **stats: Any) -> Table:
    """A copy of ``table`` with statistics replaced (tables are immutable)."""
    return replace(table, **stats)


def _read_csv(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [{k.strip(): v.strip() for k, v in row.items() if v is not None and v.strip() != ""}
            for row in rows]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _to_int(value: Any) -> int:
    as_float = float(value)
    if not as_float.is_integer():
        raise ValueError(f"{value!r} is not an integer")
    return int(as_float)


def _convertible(key: str, value: Any) -> bool:
    try:
        if key in ("rows", "dim", "bytes_per_element", "optimizer_bytes_per_row", "rows_used"):
            _to_int(value)
        elif key in ("pooling_factor", "pooling_std", "coverage", "zipf_alpha"):
            float(value)
        return True
    except (TypeError, ValueError):
        return False

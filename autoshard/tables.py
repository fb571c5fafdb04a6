"""Embedding tables and their statistics; table files in JSON, YAML or CSV."""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autoshard.access import AccessCurve
from autoshard.errors import InputError
from autoshard.fileio import (
    SCHEMA_VERSION,
    check_csv_header,
    check_schema,
    open_text,
    read_structured,
    write_structured,
)
from autoshard.limits import (
    MAX_DIM,
    MAX_OPTIMIZER_BYTES_PER_ROW,
    MAX_POOLING,
    MAX_ROWS,
    MAX_ZIPF_ALPHA,
    int_in,
    is_int,
    number_in,
)

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
        features: The features (model inputs) that look the table up, where known (a TorchRec
            model's); statistics files are matched by them. Planning does not read them: the
            lookups per sample are ``pooling_factor`` x ``coverage``, all features together.
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
    features: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, value, ok, rule in self._checks():
            if not ok:
                raise InputError(rule, field=f"{self.name}.{name}", value=value)

    def _checks(self) -> list[tuple[str, Any, bool, str]]:
        """(field, value, valid, rule) for every field."""
        hist = self.reuse_hist
        return [
            ("name", self.name, isinstance(self.name, str) and bool(self.name),
             "must be a non-empty string"),
            ("rows", self.rows, int_in(self.rows, 1, MAX_ROWS),
             f"must be an integer in [1, {MAX_ROWS:,}] (2^40)"),
            ("dim", self.dim, int_in(self.dim, 1, MAX_DIM),
             f"must be an integer in [1, {MAX_DIM:,}]"),
            ("bytes_per_element", self.bytes_per_element,
             is_int(self.bytes_per_element) and self.bytes_per_element in (1, 2, 4, 8),
             "must be 1, 2, 4 or 8"),
            ("optimizer_bytes_per_row", self.optimizer_bytes_per_row,
             int_in(self.optimizer_bytes_per_row, 0, MAX_OPTIMIZER_BYTES_PER_ROW),
             f"must be an integer in [0, {MAX_OPTIMIZER_BYTES_PER_ROW:,}]"),
            ("pooling_factor", self.pooling_factor,
             number_in(self.pooling_factor, 0, MAX_POOLING, open_low=True),
             f"must be a number in (0, {MAX_POOLING:g}]"),
            ("pooling_std", self.pooling_std, self.pooling_std is None
             or number_in(self.pooling_std, 0, MAX_POOLING),
             f"must be a number in [0, {MAX_POOLING:g}]"),
            ("coverage", self.coverage, number_in(self.coverage, 0, 1, open_low=True),
             "must be a number in (0, 1]"),
            ("rows_used", self.rows_used, self.rows_used is None
             or (is_int(self.rows_used) and 0 < self.rows_used <= self.rows),
             "must be an integer in [1, rows]"),
            ("access_cdf", self.access_cdf, self.access_cdf is None
             or isinstance(self.access_cdf, AccessCurve), "must be an access curve"),
            ("zipf_alpha", self.zipf_alpha, self.zipf_alpha is None
             or number_in(self.zipf_alpha, 0, MAX_ZIPF_ALPHA),
             f"must be a number in [0, {MAX_ZIPF_ALPHA:g}]"),
            ("reuse_hist", hist, hist is None
             or (isinstance(hist, tuple) and len(hist) == REUSE_BINS
                 and all(number_in(v, 0, 1) for v in hist)),
             f"must be {REUSE_BINS} shares in [0, 1]"),
            ("features", self.features, isinstance(self.features, tuple)
             and all(isinstance(f, str) and f for f in self.features)
             and len(set(self.features)) == len(self.features),
             "must be a list of distinct non-empty names"),
        ]

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
        if self.features:
            doc["features"] = list(self.features)
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
        kwargs = {key: _convert(key, value, source, str(name)) for key, value in doc.items()}
        try:
            return cls(**kwargs)
        except InputError as exc:
            raise exc.located(source, str(name)) from exc


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
    """One mapping per data line of a table CSV (UTF-8, a byte-order mark dropped); a binary
    file or a header naming a column twice is an InputError naming the file."""
    try:
        with open_text(path) as fh:
            reader = csv.DictReader(fh)
            check_csv_header(reader.fieldnames, str(path))
            rows = list(reader)
    except csv.Error as exc:
        raise InputError(f"cannot read: {exc}".splitlines()[0], source=str(path)) from exc
    docs = []
    for line, row in enumerate(rows, start=2):
        if None in row:
            raise InputError("more values than columns in the header", source=str(path),
                             field=f"line {line}", value=row[None])  # type: ignore[index]
        docs.append({k.strip(): v.strip() for k, v in row.items()
                     if k is not None and v is not None and v.strip() != ""})
    return docs


_INT_FIELDS = ("rows", "dim", "bytes_per_element", "optimizer_bytes_per_row", "rows_used")
_FLOAT_FIELDS = ("pooling_factor", "pooling_std", "coverage", "zipf_alpha")


def _convert(key: str, value: Any, source: str, name: str) -> Any:
    """A file value converted to the field's type (CSV gives strings); errors name the field."""
    if value is None:
        return None
    try:
        if key in _INT_FIELDS:
            return _to_int(value)
        if key in _FLOAT_FIELDS:
            if isinstance(value, bool):
                raise ValueError("not a number")
            return float(value)
        if key == "access_cdf":
            return AccessCurve.from_dict(value)
        if key == "name" and is_int(value):  # YAML reads `name: 17` as a number
            return str(value)
        if key == "features":
            if isinstance(value, str):  # a CSV cell or a lone name: separated by ';' or spaces
                value = [v for v in re.split(r"[;\s]+", value) if v]
            if not isinstance(value, (list, tuple)):
                raise ValueError("expected a list of names")
            return tuple(str(v) if is_int(v) else v for v in value)
        if key == "reuse_hist":
            if isinstance(value, str):  # a CSV cell: values separated by ';' or spaces
                value = [v for v in re.split(r"[;\s]+", value) if v]
            return tuple(float(v) for v in value)
        return value
    except InputError as exc:
        raise exc.located(source, name) from exc
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise InputError(f"invalid value ({exc})", source=source, field=f"{name}.{key}",
                         value=value) from exc


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    as_float = float(value)
    if not as_float.is_integer():
        raise ValueError(f"{value!r} is not an integer")
    return int(as_float)

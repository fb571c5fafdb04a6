"""What a sparse server holds: tables, or row ranges of them, at a serving precision.

A :class:`PartSet` cuts each table into parts by row fraction. A plain row split (of a table
larger than a server) cuts ids as they are: hashed ids spread lookups evenly, so a part serves
its share of the rows. A split by heat (ElasticRec's hot and cold shards, the main server's
hot-row cache) first renumbers rows hottest first, so a part ``[lo, hi)`` serves
``curve(hi) - curve(lo)`` of the table's lookups (:meth:`autoshard.tables.Table.access_curve`).

Precision: rows are served in fp32, fp16, or 8- and 4-bit integers with a 4-byte scale and bias
per row, as FBGEMM's inference tables store them (``unpadded_row_size_in_bytes`` in fbgemm_gpu,
rows unaligned on CPU). Pooled results leave a server in fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoshard.errors import InputError
from autoshard.limits import one_of
from autoshard.serving.model import ServingModel

#: Bits per element of each serving precision, and the scale/bias bytes each row carries.
PRECISIONS: dict[str, tuple[int, int]] = {"fp32": (32, 0), "fp16": (16, 0), "int8": (8, 4),
                                          "int4": (4, 4)}


def check_precision(name: str, field: str = "precision", source: str | None = None) -> str:
    """``name`` when it is a serving precision (:data:`PRECISIONS`)."""
    return one_of(name, tuple(PRECISIONS), field, source)


def row_bytes(model: ServingModel, precision: str) -> np.ndarray:
    """Bytes of one served row of each table at ``precision`` (fp32 keeps the table's own
    element size)."""
    check_precision(precision)
    dims = np.array([t.dim for t in model.tables], float)
    if precision == "fp32":
        return np.array([t.row_bytes for t in model.tables], float)
    bits, extra = PRECISIONS[precision]
    return np.floor(dims * bits / 8) + extra


@dataclass(frozen=True)
class PartSet:
    """Row ranges of tables, each served as a unit.

    Args:
        table: The table of each part.
        lo: First row fraction of each part (0 for a whole table).
        hi: End row fraction of each part (1 for a whole table).
        by_heat: Whether each part's rows were renumbered hottest first (a split by heat).
    """

    table: tuple[int, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    by_heat: tuple[bool, ...]

    def __post_init__(self) -> None:
        n = len(self.table)
        if not (len(self.lo) == len(self.hi) == len(self.by_heat) == n):
            raise InputError("one lo, hi and by_heat per part", field="parts", value=n)
        if any(not 0 <= lo < hi <= 1 for lo, hi in zip(self.lo, self.hi, strict=True)):
            raise InputError("row fractions must satisfy 0 <= lo < hi <= 1", field="parts")

    @classmethod
    def whole(cls, tables: int) -> PartSet:
        return cls(tuple(range(tables)), (0.0,) * tables, (1.0,) * tables, (False,) * tables)

    @property
    def size(self) -> int:
        return len(self.table)

    @property
    def array(self) -> np.ndarray:
        return np.asarray(self.table, dtype=np.int64)

    def is_whole(self) -> bool:
        return all(lo == 0 and hi == 1 for lo, hi in zip(self.lo, self.hi, strict=True))

    def split(self, part: int, at: float, by_heat: bool) -> PartSet:
        """This set with ``part`` cut at row fraction ``at`` (inside it) into two parts; the
        new part ``[at, hi)`` is appended last."""
        lo, hi = self.lo[part], self.hi[part]
        if not lo < at < hi:
            raise InputError("cut outside the part", field="at", value=(lo, at, hi))
        heat = by_heat or self.by_heat[part]
        return PartSet((*self.table, self.table[part]),
                       (*self.lo[:part], lo, *self.lo[part + 1:], at),
                       (*self.hi[:part], at, *self.hi[part + 1:], hi),
                       (*self.by_heat[:part], heat, *self.by_heat[part + 1:], heat))

    def shares(self, model: ServingModel) -> np.ndarray:
        """Share of its table's lookups each part serves."""
        out = np.array(self.hi) - np.array(self.lo)
        for i in np.flatnonzero(self.by_heat):
            curve = model.tables[self.table[i]].access_curve()
            out[i] = float(curve.share_at(self.hi[i]) - curve.share_at(self.lo[i]))
        return np.clip(out, 0.0, 1.0)

    def touch(self, model: ServingModel) -> tuple[np.ndarray, np.ndarray]:
        """(probability a part is touched given its table is, lookups it then serves): a
        table's lookups fall on a part independently with its share."""
        share = self.shares(model)
        lookups = model.lookups()[self.array]
        whole = share >= 1 - 1e-12
        q = np.where(whole, 1.0, -np.expm1(lookups * np.log1p(-np.minimum(share, 1 - 1e-12))))
        q = np.maximum(q, 1e-12)
        return q, np.where(whole, lookups, lookups * share / q)

    def to_dict(self, model: ServingModel) -> list[dict[str, object]]:
        return [{"table": model.tables[t].name, "lo": lo, "hi": hi, "by_heat": h}
                for t, lo, hi, h in zip(self.table, self.lo, self.hi, self.by_heat,
                                        strict=True)]

    @classmethod
    def from_dict(cls, doc: object, model: ServingModel, source: str) -> PartSet:
        if not isinstance(doc, list) or not doc:
            raise InputError("expected a list of parts", source=source, field="parts")
        index = {t.name: i for i, t in enumerate(model.tables)}
        try:
            parts = cls(tuple(index[d["table"]] for d in doc),
                        tuple(float(d["lo"]) for d in doc), tuple(float(d["hi"]) for d in doc),
                        tuple(bool(d.get("by_heat", False)) for d in doc))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"bad part ({exc})", source=source, field="parts") from exc
        except InputError as exc:
            raise exc.located(source) from exc
        covered = np.zeros(model.num_tables)
        np.add.at(covered, parts.array, np.array(parts.hi) - np.array(parts.lo))
        if np.any(np.abs(covered - 1) > 1e-9):
            bad = int(np.argmax(np.abs(covered - 1)))
            raise InputError("the parts of a table must cover its rows once", source=source,
                             field="parts", value=model.tables[bad].name)
        return parts


def fitting_parts(model: ServingModel, precision: str, usable_bytes: float) -> PartSet:
    """Whole tables, except that a table larger than ``usable_bytes`` (one server's memory
    less headroom) is row-split into equal parts that each fit."""
    sizes = np.array([t.rows for t in model.tables], float) * row_bytes(model, precision)
    parts = PartSet.whole(model.num_tables)
    for t in np.flatnonzero(sizes > usable_bytes):
        pieces = math.ceil(float(sizes[t]) / usable_bytes * (1 + 1e-9))
        for k in range(1, pieces):
            parts = parts.split(int(t), 1 - k / pieces, by_heat=False)
    return parts

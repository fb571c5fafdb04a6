"""Partial profiles: the mergeable counts of a part of the data, saved and merged later.

A partial profile holds, per table, the sums that merge by addition (samples, samples where
the feature is present, lookups, squared lookups per sample), and either the exact per-row
counts (with the exact set of distinct raw values of a hashed column) or the table's sketches
(:mod:`autoshard.stats.sketch`). Its :class:`ProfileSchema` says what makes two partial
profiles mergeable: the same tables in the same order, each with the same hash size (declared,
or grown from row ids), the same kind of values (hashed raw values or row ids), the same
counting mode (exact or sketched) and the same multi-hot separator. Its pieces say which inputs
it covers; a merge refuses an input covered twice.

Saved as one ``.npz`` file (numpy's zip of arrays, read with ``allow_pickle=False``): an entry
``meta`` holds the JSON document (schema, pieces, sums), the others the arrays. Never pickle.
"""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError
from autoshard.fileio import check_schema, json_text, write_output
from autoshard.stats.inputs import Piece
from autoshard.stats.sketch import LG_DISTINCT, LG_FREQUENT, LG_SAMPLE, DistinctSketch, TableSketch
from autoshard.stats.table_stats import (
    CountHistogram,
    DenseCounts,
    ExactDistinct,
    SparseCounts,
    TableProfile,
)

KIND = "partial-profile"
VERSION = 1
#: Sketch parameters recorded in each partial profile (merging needs the same ones).
SKETCH_PARAMS = {"lg_frequent": LG_FREQUENT, "lg_sample": LG_SAMPLE, "lg_distinct": LG_DISTINCT}


@dataclass(frozen=True)
class TableSchema:
    """What a table's counts mean.

    Args:
        name: Table name.
        hash_size: Declared rows; ``None``: row ids, the table grows to the largest id + 1.
        hashed: Raw values hashed into the table (else row ids used as they are).
        sketched: Counted by sketches (the exact counts did not fit the memory given).
    """

    name: str
    hash_size: int | None
    hashed: bool
    sketched: bool


@dataclass(frozen=True)
class ProfileSchema:
    """The tables of a profile and how they were counted (see the module docstring)."""

    tables: tuple[TableSchema, ...]
    list_sep: str = "|"

    def to_dict(self) -> dict[str, Any]:
        return {"list_sep": self.list_sep, "sketch": SKETCH_PARAMS,
                "tables": [vars(t) for t in self.tables]}

    @classmethod
    def from_dict(cls, doc: dict[str, Any], source: str) -> ProfileSchema:
        try:
            tables = tuple(TableSchema(str(t["name"]), None if t["hash_size"] is None
                                       else int(t["hash_size"]), bool(t["hashed"]),
                                       bool(t["sketched"])) for t in doc["tables"])
            schema = cls(tables, str(doc["list_sep"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"malformed schema ({exc!r})", source=source,
                             field="tables") from exc
        if doc.get("sketch") != SKETCH_PARAMS:
            raise InputError(f"sketches of other sizes (this autoshard makes {SKETCH_PARAMS})",
                             source=source, field="sketch", value=doc.get("sketch"))
        return schema

    def check_mergeable(self, other: ProfileSchema, source: str) -> None:
        """Refuses a profile of ``other`` tables (the error names ``source`` and the field)."""
        if other.list_sep != self.list_sep:
            raise InputError("multi-hot cells split differently", source=source,
                             field="list_sep", value=other.list_sep)
        mine, theirs = [t.name for t in self.tables], [t.name for t in other.tables]
        if mine != theirs:
            diff = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False))
                         if a != b), min(len(mine), len(theirs)))
            raise InputError(f"other tables ({len(theirs)} tables, expected {len(mine)}; "
                             f"first difference at table {diff})", source=source,
                             field="tables", value=theirs[diff] if diff < len(theirs) else None)
        for a, b in zip(self.tables, other.tables, strict=True):
            for what in ("hash_size", "hashed", "sketched"):
                if getattr(a, what) != getattr(b, what):
                    raise InputError(f"{what} differs (expected {getattr(a, what)})",
                                     source=source, field=f"{a.name}.{what}",
                                     value=getattr(b, what))


@dataclass
class TableState:
    """The mergeable counts of one table (see the module docstring).

    Args:
        samples, present, lookups, pooling_sq: Sums over the samples seen.
        seen: Largest row id + 1 seen (0: none).
        counts: Exact per-row counts, or None when sketched.
        distinct: Exact distinct raw-value hashes (sorted), for a hashed exact table.
        sketch: The table's sketches, when sketched.
        draws: HyperLogLog of distinct raw values, for a hashed sketched table.
    """

    samples: int = 0
    present: int = 0
    lookups: int = 0
    pooling_sq: int = 0
    seen: int = 0
    counts: SparseCounts | DenseCounts | None = None
    distinct: ExactDistinct | None = None
    sketch: TableSketch | None = None
    draws: DistinctSketch | None = None

    def sums(self) -> dict[str, int]:
        return {"samples": self.samples, "present": self.present, "lookups": self.lookups,
                "pooling_sq": self.pooling_sq, "seen": self.seen}

    @classmethod
    def from_sums(cls, sums: dict[str, int]) -> TableState:
        """A state holding only the sums of :meth:`sums`."""
        return cls(samples=sums["samples"], present=sums["present"], lookups=sums["lookups"],
                   pooling_sq=sums["pooling_sq"], seen=sums["seen"])

    def merged(self, other: TableState) -> TableState:
        """The counts of both."""
        out = TableState(self.samples + other.samples, self.present + other.present,
                         self.lookups + other.lookups, self.pooling_sq + other.pooling_sq,
                         max(self.seen, other.seen))
        if self.counts is not None and other.counts is not None:
            out.counts = self.counts.merged(other.counts)
        if self.distinct is not None and other.distinct is not None:
            out.distinct = self.distinct.merged(other.distinct)
        if self.sketch is not None and other.sketch is not None:
            out.sketch = self.sketch.merge(other.sketch)
        if self.draws is not None and other.draws is not None:
            out.draws = self.draws.merge(other.draws)
        return out


@dataclass(frozen=True)
class PartialProfile:
    """The counts of some pieces of the data (see the module docstring).

    Args:
        schema: The tables and how they were counted.
        pieces: The input pieces covered.
        tables: One state per table of the schema.
        formats: The input formats read (registry names of their readers).
    """

    schema: ProfileSchema
    pieces: tuple[Piece, ...]
    tables: tuple[TableState, ...]
    formats: tuple[str, ...] = field(default=())

    def merge(self, other: PartialProfile, source: str = "partial profile") -> PartialProfile:
        """Both profiles' counts (:func:`merge_partials` also checks that no input is covered
        twice).

        Raises:
            InputError: Other tables or hash sizes (the error names ``source``, the other
                profile's file).
        """
        self.schema.check_mergeable(other.schema, source)
        return PartialProfile(self.schema, self.pieces + other.pieces,
                              tuple(a.merged(b) for a, b in zip(self.tables, other.tables,
                                                                strict=True)),
                              tuple(sorted(set(self.formats) | set(other.formats))))

    def profiles(self) -> list[TableProfile]:
        """Per-table statistics (sketched tables carry their stated error)."""
        return [_table_profile(spec, state) for spec, state in zip(self.schema.tables,
                                                                   self.tables, strict=True)]

    def to_bytes(self) -> bytes:
        """The ``.npz`` file's bytes."""
        arrays: dict[str, np.ndarray] = {}
        for i, state in enumerate(self.tables):
            if state.counts is not None:
                arrays[f"{i}.rows"], arrays[f"{i}.counts"] = state.counts.pairs()
            if state.distinct is not None:
                arrays[f"{i}.distinct"] = state.distinct.values()
            if state.sketch is not None:
                arrays.update({f"{i}.{k}": v for k, v in state.sketch.to_arrays().items()})
            if state.draws is not None:
                arrays[f"{i}.draws"] = state.draws.to_array()
        meta = {"schema_version": VERSION, "kind": KIND, **self.schema.to_dict(),
                "formats": list(self.formats), "pieces": [p.to_dict() for p in self.pieces],
                "sums": [s.sums() for s in self.tables]}
        arrays["meta"] = np.frombuffer(json_text(meta).encode(), np.uint8)
        buffer = io.BytesIO()
        np.savez(buffer, allow_pickle=False, **arrays)
        return buffer.getvalue()

    def save(self, path: str | Path) -> None:
        """Writes the profile (atomically, through :func:`autoshard.fileio.write_output`)."""
        data = self.to_bytes()
        write_output(path, lambda fh: fh.write(data))


def _table_profile(spec: TableSchema, state: TableState) -> TableProfile:
    size = spec.hash_size or max(state.seen, 1)
    error = None
    if state.sketch is not None:
        times, rows, error = state.sketch.estimate()
        hist = _histogram(times, rows)
        draws = state.draws.count() if state.draws is not None else None
    else:
        counts = state.counts.pairs()[1] if state.counts is not None else np.zeros(0, np.int64)
        hist = CountHistogram.from_counts(counts)
        draws = state.distinct.count() if state.distinct is not None else None
    return TableProfile(name=spec.name, hash_size=size, samples=state.samples,
                        present=state.present, lookups=state.lookups,
                        pooling_sq=float(state.pooling_sq), counts=hist,
                        draws=draws if spec.hashed else None, error=error)


def _histogram(times: np.ndarray, rows: np.ndarray) -> CountHistogram:
    """Rows per access count, counts decreasing, empty entries dropped."""
    keep = (times > 0) & (rows > 0)
    values, inverse = np.unique(times[keep], return_inverse=True)
    total = np.bincount(inverse, weights=rows[keep]).astype(np.int64)
    return CountHistogram(values[::-1].astype(np.int64), total[::-1])


def load_partial(path: str | Path) -> PartialProfile:
    """Reads a partial profile written by :meth:`PartialProfile.save`.

    Raises:
        InputError: Missing, not a partial profile, another version, or malformed (names the
            file and the field).
    """
    src = str(path)
    if not Path(path).is_file():
        raise InputError("file not found", source=src)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InputError(f"not a partial profile ({exc})".splitlines()[0], source=src) from exc
    return from_arrays(arrays, src)


def from_arrays(arrays: dict[str, np.ndarray], src: str) -> PartialProfile:
    """A partial profile from its ``.npz`` entries (see :meth:`PartialProfile.to_bytes`)."""
    if "meta" not in arrays:
        raise InputError("not a partial profile (no meta entry)", source=src, field="meta")
    try:
        meta = json.loads(arrays["meta"].tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"malformed meta ({exc})", source=src, field="meta") from exc
    check_schema(meta, KIND, src, versions=(VERSION,))
    schema = ProfileSchema.from_dict(meta, src)
    try:
        pieces = tuple(Piece(str(p["path"]), int(p["start"]), int(p["stop"]),
                             int(p["nbytes"]), str(p["file_id"])) for p in meta["pieces"])
        sums = [{k: int(v) for k, v in s.items()} for s in meta["sums"]]
        states = [_state(schema.tables[i], sums[i], arrays, i, src)
                  for i in range(len(schema.tables))]
    except InputError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise InputError(f"malformed partial profile ({exc!r})", source=src,
                         field="sums") from exc
    return PartialProfile(schema, pieces, tuple(states),
                          tuple(str(f) for f in meta.get("formats", [])))


def _state(spec: TableSchema, sums: dict[str, int], arrays: dict[str, np.ndarray], i: int,
           src: str) -> TableState:
    state = TableState.from_sums(sums)
    negative = next((k for k, v in sums.items() if v < 0), None)
    if negative is not None:
        raise InputError("must be >= 0", source=src, field=f"{spec.name}.{negative}",
                         value=sums[negative])
    if spec.sketched:
        state.sketch = TableSketch.from_arrays({k: arrays[f"{i}.{k}"]
                                                for k in ("frequent", "sample")}, src)
        if spec.hashed:
            state.draws = DistinctSketch.from_array(arrays[f"{i}.draws"], src)
        return state
    rows = arrays[f"{i}.rows"].astype(np.int64)
    counts = arrays[f"{i}.counts"].astype(np.int64)
    size = spec.hash_size or state.seen
    if rows.shape != counts.shape or rows.ndim != 1 or (rows.size and (
            rows[0] < 0 or rows[-1] >= size or counts.min() < 1
            or np.any(np.diff(rows) <= 0))):
        raise InputError("row ids or counts out of range or unsorted", source=src,
                         field=f"{spec.name}.rows")
    state.counts = SparseCounts(rows, counts, spec.hash_size)
    if int(counts.sum()) != state.lookups:
        raise InputError(f"row counts add up to {int(counts.sum())}, not the lookups",
                         source=src, field=f"{spec.name}.lookups", value=state.lookups)
    if spec.hashed:
        hashes = arrays[f"{i}.distinct"].astype(np.uint64)
        if hashes.ndim != 1 or np.any(hashes[1:] <= hashes[:-1]):
            raise InputError("distinct values not sorted and distinct", source=src,
                             field=f"{spec.name}.distinct")
        state.distinct = ExactDistinct()
        state.distinct.known = hashes
    return state


class Merger:
    """Adds partial profiles one at a time (when a second one comes, the counts of tables of
    known size become dense arrays that the others add into; one profile alone stays as it is);
    refuses profiles that do not merge with the first, and an input piece covered twice."""

    def __init__(self) -> None:
        self.merged: PartialProfile | None = None
        self.spans: dict[str, list[tuple[int, int]]] = {}

    def add(self, part: PartialProfile, source: str) -> None:
        """Adds ``part``, read from ``source`` (named by errors).

        Raises:
            InputError: Other tables, hash sizes or counting modes, or an input covered twice.
        """
        if self.merged is not None:
            self.merged.schema.check_mergeable(part.schema, source)
        _claim(self.spans, part, source)
        self.merged = part if self.merged is None else _densified(self.merged).merge(part,
                                                                                     source)

    def result(self) -> PartialProfile:
        if self.merged is None:
            raise InputError("no partial profile to merge", source="command line",
                             field="PARTIAL")
        return self.merged


def merge_partials(parts: Iterable[tuple[PartialProfile, str]]) -> PartialProfile:
    """Merges partial profiles in order, each given with the file (or label) it came from;
    ``parts`` may be a generator that loads them one at a time (two are held at once).

    Raises:
        InputError: Nothing to merge, profiles that do not merge, or an input covered twice
            (names the file).
    """
    merger = Merger()
    for part, source in parts:
        merger.add(part, source)
    return merger.result()


def _densified(part: PartialProfile) -> PartialProfile:
    """The profile with the exact counts of tables of known size as dense arrays, which the
    merge then adds into (their size is what the memory budget allowed)."""
    states: list[TableState] = []
    for spec, state in zip(part.schema.tables, part.tables, strict=True):
        if spec.hash_size is not None and isinstance(state.counts, SparseCounts):
            dense = DenseCounts(spec.hash_size)
            dense.add_pairs(*state.counts.pairs())
            state = dataclasses.replace(state, counts=dense)
        states.append(state)
    return PartialProfile(part.schema, part.pieces, tuple(states), part.formats)


def _claim(spans: dict[str, list[tuple[int, int]]], part: PartialProfile, source: str) -> None:
    """Records the part's pieces; refuses one that overlaps a piece already recorded."""
    for piece in part.pieces:
        stop = 2**62 if piece.whole else piece.stop
        taken = spans.setdefault(piece.file_id, [])
        if any(piece.start < b and a < stop for a, b in taken):
            raise InputError("input covered twice (by two of the profiles merged, or named "
                             "twice)", source=source, field="inputs", value=piece.path)
        taken.append((piece.start, stop))

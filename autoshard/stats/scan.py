"""Counting a dataset of many files: one schema for all of them, then one piece at a time.

:func:`plan_scan` reads only headers and metadata: it finds each file's reader
(:mod:`autoshard.stats.readers`, by ``--format`` or by detection) and tables, checks that every
file has the same tables (a file of another schema is an error naming it and the field), decides
per table whether its exact counts fit the memory given (the smallest tables first; the rest
are sketched) and cuts the files into pieces. :func:`scan_piece` then counts one piece into a
:class:`~autoshard.stats.partial.PartialProfile`; any worker can run it, in any order, and the
pieces' profiles add up to the profile of the whole. Nothing here knows a format: each file's
reader does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autoshard.errors import InputError
from autoshard.limits import MAX_THREADS, Range
from autoshard.stats.inputs import Piece
from autoshard.stats.partial import PartialProfile, ProfileSchema, TableSchema, TableState
from autoshard.stats.readers import (
    FilePlan,
    ScanOptions,
    detect_format,
    get_reader,
    list_separator,
)
from autoshard.stats.sketch import SKETCH_BYTES, DistinctSketch, TableSketch
from autoshard.stats.table_stats import ExactDistinct, SparseCounts

#: Memory per process for exact counts, GB (``--memory-gb``): from 1 MB to 1 PB.
MEMORY_GB = Range(0.001, 1e6)
#: Input per piece of work, MB (``--piece-mb``).
PIECE_MB = Range(1, 1e6)
#: Processes or local workers (``--jobs``); 0: one per core.
JOBS = Range(0, MAX_THREADS, integer=True)


@dataclass(frozen=True)
class ScanPlan:
    """Everything a worker needs to count any piece (small, sent to every worker)."""

    schema: ProfileSchema
    files: tuple[FilePlan, ...]
    pieces: tuple[Piece, ...]
    options: ScanOptions

    def file(self, path: str) -> FilePlan:
        return next(f for f in self.files if f.path == path)

    @property
    def digest(self) -> str:
        """Identifies what is counted and how (names a run's saved parts)."""
        doc = {"schema": self.schema.to_dict(),
               "files": [dataclasses.asdict(f) for f in self.files],
               "options": [self.options.fmt, self.options.hash_size, self.options.hash_sizes]}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=list).encode()
                              ).hexdigest()[:12]


def plan_scan(paths: Sequence[Path], options: ScanOptions) -> ScanPlan:
    """The schema, file plans and pieces of a dataset (headers and metadata only).

    Raises:
        InputError: An unknown format, an unreadable file, or one whose tables differ from the
            first file's (names the file and the field).
    """
    formats = [options.fmt or detect_format(p) for p in paths]
    readers = {fmt: get_reader(fmt) for fmt in formats}
    list_sep = list_separator(readers.values())
    files, schema = [], None
    first: dict[str, tuple[TableSchema, ...]] = {}  # the tables of each format's first file
    for path, fmt in zip(paths, formats, strict=True):
        layout, tables = readers[fmt].tables(path, options, list_sep, first.get(fmt))
        first.setdefault(fmt, tables)
        found = ProfileSchema(tables, list_sep)
        if schema is None:
            schema = found
        schema.check_mergeable(found, str(path))
        files.append(FilePlan(str(path), fmt, layout))
    assert schema is not None
    schema = ProfileSchema(_choose_modes(schema.tables, options.memory_bytes), list_sep)
    pieces = [piece for f in files for piece in readers[f.fmt].pieces(f, options.piece_bytes)]
    return ScanPlan(schema, tuple(files), tuple(pieces), options)


def _choose_modes(tables: Sequence[TableSchema], memory_bytes: int) -> tuple[TableSchema, ...]:
    """Counts exactly the smallest tables whose counts (8 bytes a row) fit the memory left
    after the larger tables' sketches; a table whose counts take less than a sketch, or of
    undeclared size, is always exact."""
    order = sorted(range(len(tables)), key=lambda i: (tables[i].hash_size or 0, i))
    sketched: set[int] = set()
    for i in reversed(order):
        exact = sum(8 * (tables[j].hash_size or 0) for j in order if j not in sketched)
        if exact + SKETCH_BYTES * len(sketched) <= memory_bytes:
            break
        if 8 * (tables[i].hash_size or 0) <= SKETCH_BYTES:
            break
        sketched.add(i)
    return tuple(TableSchema(t.name, t.hash_size, t.hashed, i in sketched)
                 for i, t in enumerate(tables))


class PartialAccumulator:
    """Counts the lookups of one piece, table by table, as its schema says (the
    :class:`~autoshard.stats.readers.Sink` every reader fills).

    Args:
        schema: The tables and how each is counted.
    """

    def __init__(self, schema: ProfileSchema) -> None:
        self.schema = schema
        self.states = [TableState(counts=None if t.sketched else SparseCounts(
            hash_size=t.hash_size), sketch=TableSketch() if t.sketched else None)
                       for t in schema.tables]
        self.distinct: list[ExactDistinct | DistinctSketch | None] = [
            (DistinctSketch() if t.sketched else ExactDistinct()) if t.hashed else None
            for t in schema.tables]

    def add(self, table: int, indices: np.ndarray, lengths: np.ndarray) -> None:
        """Adds a chunk of a table: its checked row ids and its lookups per sample."""
        state = self.states[table]
        lengths = np.asarray(lengths, dtype=np.int64)
        state.samples += int(lengths.size)
        state.present += int(np.count_nonzero(lengths))
        state.pooling_sq += int(np.dot(lengths, lengths))
        state.lookups += int(indices.size)
        if indices.size == 0:
            return
        state.seen = max(state.seen, int(indices.max()) + 1)
        if state.sketch is not None:
            state.sketch.add(indices)
        else:
            assert isinstance(state.counts, SparseCounts)
            state.counts.add(indices)

    def add_raw(self, table: int, hashes: np.ndarray) -> None:
        """Adds the 64-bit hashes of raw values hashed into a table (its distinct raw values)."""
        distinct = self.distinct[table]
        assert distinct is not None, f"table {table} holds row ids, not hashed raw values"
        distinct.add(hashes)

    def result(self, piece: Piece, fmt: str) -> PartialProfile:
        for state, distinct in zip(self.states, self.distinct, strict=True):
            if isinstance(distinct, ExactDistinct):
                state.distinct = distinct
            elif isinstance(distinct, DistinctSketch):
                state.draws = distinct
        return PartialProfile(self.schema, (piece,), tuple(self.states), (fmt,))


def scan_piece(plan: ScanPlan, piece: Piece) -> PartialProfile:
    """Counts one piece of the data, with its file's reader.

    Raises:
        InputError: Bad data in the piece (names the file, the table or column and the row),
            or no data at all.
    """
    file = plan.file(piece.path)
    acc = PartialAccumulator(plan.schema)
    get_reader(file.fmt).scan(file, piece, plan.schema, acc)
    if not any(state.samples for state in acc.states):
        raise InputError("no data rows", source=piece.label)
    return acc.result(piece, file.fmt)

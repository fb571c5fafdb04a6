"""Newline-delimited JSON (``.ndjson``, ``.jsonl``): one JSON object per line, one sample each.

Each key is a feature, one table. Its value is an id, a list of ids (a multi-hot feature, one
lookup per id), or missing: absent, ``null``, ``""`` or ``[]`` (the sample does not use the
feature, which lowers its coverage). The tables are the keys of the first :data:`HEAD_LINES`
lines, in the order they first appear, or the ``columns`` chosen among them; other keys are not
profiled. A feature whose first value there is an integer (or a list of integers) holds row ids,
used as they are; any other feature holds raw values, hashed into its table as the columnar
reader hashes strings (an integer in it is hashed as its decimal text). With ``ids`` every
feature holds row ids. Blank lines are skipped. A file is cut into pieces of whole lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError
from autoshard.stats.inputs import Piece, fingerprint, text_pieces
from autoshard.stats.partial import ProfileSchema, TableSchema
from autoshard.stats.readers import FilePlan, Reader, ScanOptions, Sink
from autoshard.stats.readers.columnar import (
    ColumnPlan,
    check_ids,
    check_nonempty,
    choose_columns,
    hash_values,
)

#: Lines read to find the features and whether each holds row ids.
HEAD_LINES = 1000
#: Samples parsed before their lookups go to the counts.
CHUNK_LINES = 1 << 14


class JsonLinesReader(Reader):
    """Newline-delimited JSON files: one object per sample, one table per key."""

    suffixes = (".ndjson", ".jsonl")

    def tables(self, path: Path, options: ScanOptions, list_sep: str,
               first: tuple[TableSchema, ...] | None) -> tuple[Any, tuple[TableSchema, ...]]:
        check_nonempty(path)
        lines = _Lines(path, 0, path.stat().st_size)
        holds_ids: dict[str, bool | None] = {}  # feature -> whether its first value is an id
        for number, sample in lines:
            for key, value in sample.items():
                if holds_ids.get(key) is None:
                    holds_ids[key] = _holds_ids(value)
            if number >= HEAD_LINES:
                break
        if not holds_ids:
            raise InputError(f"no feature in the first {HEAD_LINES} lines", source=str(path))
        plan = choose_columns({k: bool(v) for k, v in holds_ids.items()}, options.columns,
                              options.hash_size, options.ids, list_sep, str(path))
        return None, plan.tables()

    def pieces(self, file: FilePlan, piece_bytes: int) -> list[Piece]:
        path = Path(file.path)
        return text_pieces(path, 0, piece_bytes, fingerprint(path))

    def scan(self, file: FilePlan, piece: Piece, schema: ProfileSchema, sink: Sink) -> None:
        path = Path(file.path)
        start, stop = (0, path.stat().st_size) if piece.whole else (piece.start, piece.stop)
        lines = _Lines(path, start, stop)
        chunk = _Chunk(ColumnPlan.of(schema), lines)
        for number, sample in lines:
            chunk.append(sample, number)
            if chunk.samples == CHUNK_LINES:
                chunk.flush(sink)
        chunk.flush(sink)


class _Lines:
    """The samples of the whole lines that begin in [start, stop) of a file, numbered from 1 at
    ``start`` (blank lines skipped); :meth:`line` turns such a number into the file's line
    number for errors (counting the lines before ``start`` only then)."""

    def __init__(self, path: Path, start: int, stop: int) -> None:
        self.path, self.start, self.stop = path, start, stop
        self.before: int | None = None if start else 0

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        with self.path.open("rb") as fh:
            fh.seek(self.start)
            position, number = self.start, 0
            while position < self.stop:
                line = fh.readline()
                if not line:
                    return
                position += len(line)
                number += 1
                if line.strip():
                    yield number, self._parse(line, number)

    def line(self, number: int) -> int:
        """The file's line number of line ``number`` of the range."""
        if self.before is None:
            self.before, left = 0, self.start
            with self.path.open("rb") as fh:
                while left > 0:
                    block = fh.read(min(1 << 20, left))
                    self.before += block.count(b"\n")
                    left -= len(block)
        return self.before + number

    def _parse(self, line: bytes, number: int) -> dict[str, Any]:
        """The sample of one line.

        Raises:
            InputError: Not JSON, or not a JSON object (names the file, the line and the text).
        """
        try:
            sample = json.loads(line)
        except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
            reason = f"not JSON ({getattr(exc, 'msg', None) or exc})"
        else:
            if isinstance(sample, dict):
                return sample
            reason = 'not a JSON object (one sample a line: {"feature": id or [ids], ...})'
        raise InputError(reason, source=str(self.path), field=f"line {self.line(number)}",
                         value=line.decode("utf-8", "replace").strip())


def _holds_ids(value: Any) -> bool | None:
    """Whether a feature's value is an integer id (or a list whose first id is one): True; a raw
    value: False; missing: None."""
    if isinstance(value, list):
        value = next((v for v in value if v is not None and v != ""), None)
    if value is None or value == "":
        return None
    return isinstance(value, int) and not isinstance(value, bool)


class _Chunk:
    """The ids of a run of samples, feature by feature, until they go to the counts.

    Args:
        columns: The tables.
        lines: The lines read (for errors).
    """

    def __init__(self, columns: ColumnPlan, lines: _Lines) -> None:
        self.columns, self.lines = columns, lines
        self._clear()

    def _clear(self) -> None:
        count = len(self.columns.names)
        self.values: list[list[int | str]] = [[] for _ in range(count)]
        self.numbers: list[list[int]] = [[] for _ in range(count)]
        self.lengths: list[list[int]] = [[] for _ in range(count)]

    def append(self, sample: dict[str, Any], number: int) -> None:
        """Adds one sample, from line ``number`` of the range read.

        Raises:
            InputError: A value that is not an id (a number with a fraction, a boolean, an
                object, a nested list), naming the line and the feature.
        """
        for t, name in enumerate(self.columns.names):
            value = sample.get(name)
            ids = value if isinstance(value, list) else [value]
            found = [v for v in ids if v is not None and v != ""]
            if any(isinstance(v, bool) or not isinstance(v, (int, str)) for v in found):
                raise InputError("not an id or a list of ids (strings or integers) at line "
                                 f"{self.lines.line(number)}", source=str(self.lines.path),
                                 field=name, value=value)
            self.values[t] += found
            self.numbers[t] += [number] * len(found)
            self.lengths[t].append(len(found))

    @property
    def samples(self) -> int:
        return len(self.lengths[0]) if self.lengths else 0

    def flush(self, sink: Sink) -> None:
        """Hands the samples' lookups to ``sink``, table by table, and starts a new chunk."""
        if not self.samples:
            return
        for t in range(len(self.columns.names)):
            idx = self._hashed(t, sink) if self.columns.hashed[t] else self._row_ids(t)
            sink.add(t, idx, np.asarray(self.lengths[t], dtype=np.int64))
        self._clear()

    def _hashed(self, t: int, sink: Sink) -> np.ndarray:
        """Table ``t``'s rows: its raw values hashed (the hashes also go to ``sink``)."""
        import pyarrow as pa

        if not self.values[t]:
            return np.zeros(0, np.int64)
        hashes = hash_values(pa.array([str(v) for v in self.values[t]], type=pa.string()))
        sink.add_raw(t, hashes)
        return np.remainder(hashes, np.uint64(self.columns.hash_sizes[t] or 1)).astype(np.int64)

    def _row_ids(self, t: int) -> np.ndarray:
        """Table ``t``'s row ids, checked (integers, or strings of one)."""
        name, src = self.columns.names[t], str(self.lines.path)
        ids = []
        for value, number in zip(self.values[t], self.numbers[t], strict=True):
            if isinstance(value, str) and value.lstrip("-").isdigit():
                value = int(value)
            if not isinstance(value, int) or not -2**63 <= value < 2**63:
                raise InputError(f"not an integer row id in column {name} at line "
                                 f"{self.lines.line(number)}", source=src, field=name,
                                 value=value)
            ids.append(value)
        idx = np.asarray(ids, dtype=np.int64)
        check_ids(idx, self.columns.hash_sizes[t], src, name,
                  lambda pos: self.lines.line(self.numbers[t][pos]), unit="line")
        return idx

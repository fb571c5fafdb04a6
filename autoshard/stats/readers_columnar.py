"""Categorical columns (CSV or Parquet) as embedding tables, read in chunks with pyarrow.

Each chosen column is one table. A cell holds one value, several values separated by
``list_sep`` (CSV) or a list (Parquet): a multi-hot feature with one lookup per value. Empty
cells are missing values: the sample does not use the feature, which lowers its coverage.
String values are hashed into the table's hash size with a fixed 64-bit hash (pandas'
``hash_array``), as production pipelines hash raw ids; integer values (Parquet integer columns,
or any column with ``ids=True``) are row ids used as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError
from autoshard.fileio import check_csv_header, open_text
from autoshard.stats.profile import CountAccumulator, TableProfile

#: Hash size of string columns when none is given.
DEFAULT_HASH_SIZE = 1 << 20
CHUNK_ROWS = 1 << 16

Progress = Callable[[int], None]


@dataclass(frozen=True)
class CsvLayout:
    """How to parse a CSV file: delimiter and column names (``None``: from the header)."""

    delimiter: str = ","
    names: tuple[str, ...] | None = None


def parse_hash_sizes(spec: str | int | None, columns: Sequence[str],
                     default: int | None, source: str = "--hash-size") -> list[int | None]:
    """Hash size per column from ``"N"``, ``"COL=N,COL=N"`` or both (``"N,COL=N"``)."""
    sizes: dict[str, int] = {}
    glob = default
    items = [] if spec is None else [s.strip() for s in str(spec).split(",") if s.strip()]
    for item in items:
        name, _, value = item.rpartition("=")
        try:
            size = int(value)
        except ValueError:
            raise InputError("hash size must be an integer", source=source,
                             field=name or "hash_size", value=value) from None
        if size < 1:
            raise InputError("hash size must be >= 1", source=source,
                             field=name or "hash_size", value=size)
        if not name:
            glob = size
        elif name not in columns:
            raise InputError(f"unknown column (columns: {', '.join(columns)})", source=source,
                             field=name, value=item)
        else:
            sizes[name] = size
    return [sizes.get(c, glob) for c in columns]


def profile_columnar(path: str | Path, columns: Sequence[str] | None = None,
                     hash_size: str | int | None = None, ids: bool = False,
                     list_sep: str = "|", layout: CsvLayout | None = None,
                     progress: Progress | None = None) -> list[TableProfile]:
    """Profiles each chosen column of a CSV or Parquet file as a table."""
    path = Path(path)
    src = str(path)
    if not path.is_file():
        raise InputError("file not found", source=src)
    if path.stat().st_size == 0:
        raise InputError("file is empty", source=src)
    parquet = path.suffix.lower() in (".parquet", ".pq")
    available = _parquet_columns(path) if parquet else _csv_columns(path, layout or CsvLayout())
    chosen = list(columns) if columns else available
    for c in chosen:
        if c not in available:
            raise InputError(f"unknown column (columns: {', '.join(available)})", source=src,
                             field=c)
    batches = (_parquet_batches(path, chosen) if parquet
               else _csv_batches(path, chosen, layout or CsvLayout()))
    return _profile_batches(batches, chosen, hash_size, ids, list_sep, src, progress)


def _profile_batches(batches: Iterator[Any], columns: list[str], hash_size: str | int | None,
                     ids: bool, list_sep: str, src: str,
                     progress: Progress | None) -> list[TableProfile]:
    declared = parse_hash_sizes(hash_size, columns, None)
    acc: CountAccumulator | None = None
    hashed: list[bool] = []
    distinct = [_Distinct() for _ in columns]
    row = 0
    for batch in batches:
        cells = [_cells(batch.column(name), list_sep) for name in columns]
        if acc is None:
            hashed = [not ids and not _is_integer(values) for values, _, _ in cells]
            acc = CountAccumulator(columns, [d if d is not None or not h else DEFAULT_HASH_SIZE
                                             for d, h in zip(declared, hashed, strict=True)])
        for i, (values, lengths, parent) in enumerate(cells):
            if hashed[i]:
                idx = np.remainder(_hash(values, distinct[i]), np.uint64(acc.hash_sizes[i] or 1))
            else:
                idx = _as_ids(values, parent, src, columns[i], row)
                _check_ids(idx, declared[i], parent, src, columns[i], row)
            acc.add(i, idx.astype(np.int64), lengths)
        row += batch.num_rows
        if progress is not None:
            progress(batch.num_rows)
    if acc is None or row == 0:
        raise InputError("no data rows", source=src)
    return acc.result([d.count() if h else None for d, h in zip(distinct, hashed, strict=True)])


def _check_ids(idx: np.ndarray, size: int | None, parent: np.ndarray, src: str, name: str,
               row: int) -> None:
    bad = idx < 0 if size is None else (idx < 0) | (idx >= size)
    if idx.size and bad.any():
        pos = int(np.argmax(bad))
        what = "negative row id" if idx[pos] < 0 else f"row id >= hash size {size}"
        raise InputError(f"{what} in column {name} at data row {row + int(parent[pos]) + 1}",
                         source=src, field=name, value=int(idx[pos]))


class _Distinct:
    """Distinct 64-bit hashes seen so far, merged lazily (amortised linear time)."""

    def __init__(self) -> None:
        self.known = np.zeros(0, np.uint64)
        self.pending: list[np.ndarray] = []
        self.pending_size = 0

    def add(self, hashes: np.ndarray) -> None:
        self.pending.append(np.unique(hashes))
        self.pending_size += self.pending[-1].size
        if self.pending_size > 2 * self.known.size + CHUNK_ROWS:
            self._merge()

    def _merge(self) -> None:
        self.known = np.unique(np.concatenate([self.known, *self.pending]))
        self.pending, self.pending_size = [], 0

    def count(self) -> int:
        self._merge()
        return int(self.known.size)


def _cells(column: Any, list_sep: str) -> tuple[Any, np.ndarray, np.ndarray]:
    """Flat non-missing values of a column chunk, lookups per row, and each value's row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n = len(column)
    if list_sep and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = pc.split_pattern(column, pattern=list_sep)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        flat = pc.list_flatten(column)
        parent = np.asarray(pc.list_parent_indices(column))
    else:
        flat, parent = column, np.arange(n)
    keep = pc.is_valid(flat)
    if pa.types.is_string(flat.type) or pa.types.is_large_string(flat.type):
        keep = pc.and_(keep, pc.not_equal(pc.utf8_length(flat), 0))
    keep_np = np.asarray(keep.fill_null(False))
    values = flat.filter(keep)
    parent = parent[keep_np]
    return values, np.bincount(parent, minlength=n), parent


def _is_integer(values: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(values.type))


def _as_ids(values: Any, parent: np.ndarray, src: str, name: str, row: int) -> np.ndarray:
    import pyarrow as pa

    if pa.types.is_integer(values.type):
        return np.asarray(values, dtype=np.int64)
    text = values.to_numpy(zero_copy_only=False)
    try:
        return np.asarray(text, dtype=np.int64)
    except ValueError:
        bad = next(i for i, v in enumerate(text) if not v.lstrip("-").isdigit())
        raise InputError(f"not an integer row id in column {name} at data row "
                         f"{row + int(parent[bad]) + 1}", source=src, field=name,
                         value=text[bad]) from None


def _hash(values: Any, distinct: _Distinct) -> np.ndarray:
    import pandas as pd

    text = np.asarray(values.to_numpy(zero_copy_only=False), dtype=object)
    hashes = pd.util.hash_array(text, categorize=True)
    distinct.add(hashes)
    return np.asarray(hashes, dtype=np.uint64)


def _parquet_columns(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    try:
        return list(pq.ParquetFile(path).schema_arrow.names)
    except Exception as exc:
        raise InputError(f"cannot read Parquet file, truncated or corrupt ({exc})"
                         .splitlines()[0], source=str(path)) from exc


def _parquet_batches(path: Path, columns: list[str]) -> Iterator[Any]:
    import pyarrow.parquet as pq

    try:
        yield from pq.ParquetFile(path).iter_batches(batch_size=CHUNK_ROWS, columns=columns)
    except OSError as exc:
        raise InputError(f"cannot read Parquet file ({exc})".splitlines()[0],
                         source=str(path)) from exc


def _csv_columns(path: Path, layout: CsvLayout) -> list[str]:
    if layout.names is not None:
        return list(layout.names)
    with open_text(path) as fh:
        header = fh.readline().rstrip("\r\n")
    return check_csv_header(header.split(layout.delimiter), str(path))


def _csv_batches(path: Path, columns: list[str], layout: CsvLayout) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    names = _csv_columns(path, layout)
    read = pcsv.ReadOptions(column_names=names, skip_rows=0 if layout.names else 1,
                            block_size=8 << 20)
    parse = pcsv.ParseOptions(delimiter=layout.delimiter)
    convert = pcsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()),
                                  include_columns=columns, strings_can_be_null=False)
    try:
        yield from pcsv.open_csv(path, read_options=read, parse_options=parse,
                                 convert_options=convert)
    except pa.ArrowInvalid as exc:
        raise InputError(f"malformed or truncated CSV ({exc})".splitlines()[0],
                         source=str(path)) from exc

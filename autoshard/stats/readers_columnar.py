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
from autoshard.stats.table_stats import CountAccumulator, TableProfile

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


@dataclass(frozen=True)
class ColumnPlan:
    """How each chosen column becomes a table.

    Args:
        names: The columns (one table each).
        hashed: Per column, whether values are raw values hashed into the table (strings) or
            row ids used as they are (integers, or any column with ``ids=True``).
        hash_sizes: Declared rows per table; ``None``: row ids, grown to the largest + 1.
        list_sep: Separator of values in a multi-hot text cell ("" for none).
    """

    names: tuple[str, ...]
    hashed: tuple[bool, ...]
    hash_sizes: tuple[int | None, ...]
    list_sep: str = "|"


def column_plan(path: str | Path, columns: Sequence[str] | None = None,
                hash_size: str | int | None = None, ids: bool = False, list_sep: str = "|",
                layout: CsvLayout | None = None) -> ColumnPlan:
    """The tables of a CSV or Parquet file, from its header or schema (no data is read).

    Raises:
        InputError: A missing, empty or unreadable file, or an unknown column.
    """
    path = Path(path)
    src = str(path)
    if not path.is_file():
        raise InputError("file not found", source=src)
    if path.stat().st_size == 0:
        raise InputError("file is empty", source=src)
    types = (_parquet_types(path) if is_parquet(path)
             else dict.fromkeys(_csv_columns(path, layout or CsvLayout()), False))
    chosen = list(columns) if columns else list(types)
    for c in chosen:
        if c not in types:
            raise InputError(f"unknown column (columns: {', '.join(types)})", source=src,
                             field=c)
    hashed = [not ids and not types[c] for c in chosen]
    declared = parse_hash_sizes(hash_size, chosen, None)
    sizes = [d if d is not None or not h else DEFAULT_HASH_SIZE
             for d, h in zip(declared, hashed, strict=True)]
    return ColumnPlan(tuple(chosen), tuple(hashed), tuple(sizes), list_sep)


def is_parquet(path: Path) -> bool:
    """Whether a file is Parquet (by its suffix)."""
    return path.suffix.lower() in (".parquet", ".pq")


def profile_columnar(path: str | Path, columns: Sequence[str] | None = None,
                     hash_size: str | int | None = None, ids: bool = False,
                     list_sep: str = "|", layout: CsvLayout | None = None,
                     progress: Progress | None = None) -> list[TableProfile]:
    """Profiles each chosen column of a CSV or Parquet file as a table."""
    path = Path(path)
    plan = column_plan(path, columns, hash_size, ids, list_sep, layout)
    batches = (parquet_batches(path, list(plan.names)) if is_parquet(path)
               else csv_batches(path, list(plan.names), layout or CsvLayout()))
    acc = CountAccumulator(plan.names, plan.hash_sizes)
    distinct = [ExactDistinct() for _ in plan.names]
    rows = 0
    for table, idx, lengths in iter_lookups(batches, plan, str(path), distinct):
        acc.add(table, idx, lengths)
        if table == len(plan.names) - 1:
            rows += lengths.size
            if progress is not None:
                progress(lengths.size)
    if rows == 0:
        raise InputError("no data rows", source=str(path))
    return acc.result([d.count() if h else None
                       for d, h in zip(distinct, plan.hashed, strict=True)])


def iter_lookups(batches: Iterator[Any], plan: ColumnPlan, src: str,
                 distinct: Sequence[Any]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(table, row ids, lookups per row) of each column of each batch; the raw-value hashes of
    hashed columns also go to ``distinct[table].add``. Row ids are checked against declared
    hash sizes (errors name the column and the data row)."""
    row = 0
    for batch in batches:
        for i, name in enumerate(plan.names):
            values, lengths, parent = _cells(batch.column(name), plan.list_sep)
            if plan.hashed[i]:
                hashes = _hash(values)
                distinct[i].add(hashes)
                idx = np.remainder(hashes, np.uint64(plan.hash_sizes[i] or 1))
            else:
                idx = _as_ids(values, parent, src, name, row)
                _check_ids(idx, plan.hash_sizes[i], parent, src, name, row)
            yield i, idx.astype(np.int64), lengths
        row += batch.num_rows


def _check_ids(idx: np.ndarray, size: int | None, parent: np.ndarray, src: str, name: str,
               row: int) -> None:
    bad = idx < 0 if size is None else (idx < 0) | (idx >= size)
    if idx.size and bad.any():
        pos = int(np.argmax(bad))
        what = "negative row id" if idx[pos] < 0 else f"row id >= hash size {size}"
        raise InputError(f"{what} in column {name} at data row {row + int(parent[pos]) + 1}",
                         source=src, field=name, value=int(idx[pos]))


class ExactDistinct:
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
        # every part is sorted: a stable sort (timsort) merges the runs in n log(runs)
        merged = np.sort(np.concatenate([self.known, *self.pending]), kind="stable")
        if merged.size:
            merged = merged[np.concatenate(([True], merged[1:] != merged[:-1]))]
        self.known = merged
        self.pending, self.pending_size = [], 0

    def merged(self, other: ExactDistinct) -> ExactDistinct:
        """A new set of both (merged lazily)."""
        out = ExactDistinct()
        out.known = self.known
        out.pending, out.pending_size = list(self.pending), self.pending_size
        out.pending.append(other.values())
        out.pending_size += out.pending[-1].size
        return out

    def values(self) -> np.ndarray:
        """The distinct hashes, sorted."""
        self._merge()
        return self.known

    def count(self) -> int:
        return int(self.values().size)


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
    if pa.types.is_string(flat.type) or pa.types.is_large_string(flat.type):
        keep_np = np.asarray(pc.binary_length(flat).fill_null(0)) > 0  # not null, not empty
    else:
        keep_np = np.asarray(pc.is_valid(flat))
    values = flat.filter(pa.array(keep_np))
    parent = parent[keep_np]
    return values, np.bincount(parent, minlength=n), parent


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


def _hash(values: Any) -> np.ndarray:
    """Fixed 64-bit hashes of string values (pandas' ``hash_array``), each distinct value of
    the chunk hashed once."""
    import pandas as pd
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(values)  # values: one array (see _cells)
    text = np.asarray(encoded.dictionary.to_numpy(zero_copy_only=False), dtype=object)
    hashes = np.asarray(pd.util.hash_array(text, categorize=False), dtype=np.uint64)
    return hashes[np.asarray(encoded.indices, dtype=np.int64)]



def _parquet_types(path: Path) -> dict[str, bool]:
    """Column name -> whether it holds integers (or lists of integers): row ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.ParquetFile(path).schema_arrow
    except Exception as exc:
        raise InputError(f"cannot read Parquet file, truncated or corrupt ({exc})"
                         .splitlines()[0], source=str(path)) from exc
    out = {}
    for field in schema:
        kind = field.type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            kind = kind.value_type
        out[field.name] = bool(pa.types.is_integer(kind))
    return out


def parquet_batches(path: Path, columns: list[str],
                    row_groups: Sequence[int] | None = None) -> Iterator[Any]:
    """Record batches of the chosen columns (of the given row groups, or all)."""
    import pyarrow.parquet as pq

    try:
        yield from pq.ParquetFile(path).iter_batches(batch_size=CHUNK_ROWS, columns=columns,
                                                     row_groups=row_groups)
    except OSError as exc:
        raise InputError(f"cannot read Parquet file ({exc})".splitlines()[0],
                         source=str(path)) from exc


def _csv_columns(path: Path, layout: CsvLayout) -> list[str]:
    if layout.names is not None:
        return list(layout.names)
    with open_text(path) as fh:
        header = fh.readline().rstrip("\r\n")
    return check_csv_header(header.split(layout.delimiter), str(path))


def csv_batches(path: Path, columns: list[str], layout: CsvLayout,
                byte_range: tuple[int, int] | None = None) -> Iterator[Any]:
    """Record batches of the chosen columns, all read as text; ``byte_range`` reads only the
    whole lines in [start, stop) of the file (the header, if any, lies before it)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    names = _csv_columns(path, layout)
    source: Any = path
    if byte_range is not None:
        source = pa.memory_map(str(path)).get_stream(byte_range[0],
                                                     byte_range[1] - byte_range[0])
    skip = 0 if layout.names or byte_range is not None else 1
    read = pcsv.ReadOptions(column_names=names, skip_rows=skip, block_size=8 << 20)
    parse = pcsv.ParseOptions(delimiter=layout.delimiter)
    convert = pcsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()),
                                  include_columns=columns, strings_can_be_null=False)
    try:
        yield from pcsv.open_csv(source, read_options=read, parse_options=parse,
                                 convert_options=convert)
    except pa.ArrowInvalid as exc:
        raise InputError(f"malformed or truncated CSV ({exc})".splitlines()[0],
                         source=str(path)) from exc

"""Categorical columns (CSV or Parquet) as embedding tables, read in chunks with pyarrow.

Each chosen column is one table. A cell holds one value, several values separated by
``list_sep`` (CSV) or a list (Parquet): a multi-hot feature with one lookup per value. Empty
cells are missing values: the sample does not use the feature, which lowers its coverage.
String values are hashed into the table's hash size with a fixed 64-bit hash (pandas'
``hash_array``), as production pipelines hash raw ids; integer values (Parquet integer columns,
or any column with ``ids=True``) are row ids used as they are.

A CSV file is cut into pieces of whole lines, a Parquet file into runs of row groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoshard.errors import InputError
from autoshard.fileio import check_csv_header, open_text
from autoshard.stats.inputs import Piece, fingerprint, parquet_pieces, text_pieces
from autoshard.stats.partial import ProfileSchema, TableSchema
from autoshard.stats.readers import ANY_FILE, BY_NAME, LIST_SEP, FilePlan, Reader, ScanOptions, Sink

#: Hash size of string columns when none is given.
DEFAULT_HASH_SIZE = 1 << 20
CHUNK_ROWS = 1 << 16


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
    list_sep: str = LIST_SEP

    @classmethod
    def of(cls, schema: ProfileSchema) -> ColumnPlan:
        """The plan a schema's tables say."""
        tables = schema.tables
        return cls(tuple(t.name for t in tables), tuple(t.hashed for t in tables),
                   tuple(t.hash_size for t in tables), schema.list_sep)

    def tables(self) -> tuple[TableSchema, ...]:
        """The tables (counting modes not decided yet)."""
        return tuple(TableSchema(n, s, h, False) for n, s, h in
                     zip(self.names, self.hash_sizes, self.hashed, strict=True))


def column_plan(path: str | Path, columns: Sequence[str] | None = None,
                hash_size: str | int | None = None, ids: bool = False, list_sep: str = LIST_SEP,
                layout: CsvLayout | None = None) -> ColumnPlan:
    """The tables of a CSV or Parquet file, from its header or schema (no data is read).

    Raises:
        InputError: A missing, empty or unreadable file, or an unknown column.
    """
    path = Path(path)
    check_nonempty(path)
    types = (_parquet_types(path) if is_parquet(path)
             else dict.fromkeys(_csv_columns(path, layout or CsvLayout()), False))
    return choose_columns(types, columns, hash_size, ids, list_sep, str(path))


def check_nonempty(path: Path) -> None:
    """Refuses a missing or empty file."""
    if not path.is_file():
        raise InputError("file not found", source=str(path))
    if path.stat().st_size == 0:
        raise InputError("file is empty", source=str(path))


def choose_columns(types: Mapping[str, bool], columns: Sequence[str] | None,
                   hash_size: str | int | None, ids: bool, list_sep: str,
                   src: str) -> ColumnPlan:
    """The plan of the chosen ``columns`` (all when None) of a file whose columns are ``types``
    (name -> whether it holds integers, i.e. row ids): other columns are hashed (unless
    ``ids``), with :data:`DEFAULT_HASH_SIZE` rows where ``hash_size`` gives none.

    Raises:
        InputError: An unknown column, or a bad hash size.
    """
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


def iter_lookups(batches: Iterator[Any], plan: ColumnPlan, src: str
                 ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]]:
    """(table, row ids, lookups per row, raw-value hashes or None) of each column of each batch:
    the hashes of the values of hashed columns, None for columns of row ids. Row ids are checked
    against declared hash sizes (errors name the column and the data row)."""
    row = 0
    for batch in batches:
        for i, name in enumerate(plan.names):
            values, lengths, parent = _cells(batch.column(name), plan.list_sep)
            hashes = None
            if plan.hashed[i]:
                hashes = hash_values(values)
                idx = np.remainder(hashes, np.uint64(plan.hash_sizes[i] or 1))
            else:
                idx = _as_ids(values, parent, src, name, row)
                check_ids(idx, plan.hash_sizes[i], src, name, _data_row(row, parent))
            yield i, idx.astype(np.int64), lengths, hashes
        row += batch.num_rows


def _data_row(row: int, parent: np.ndarray) -> Callable[[int], int]:
    """The data row (from 1) of value ``pos`` of a batch after ``row`` rows, its row in the batch
    ``parent[pos]``."""
    return lambda pos: row + int(parent[pos]) + 1


def check_ids(idx: np.ndarray, size: int | None, src: str, name: str,
              row_of: Callable[[int], int], unit: str = "data row") -> None:
    """Refuses a negative row id, or one beyond a declared hash size; the error names the column
    and the ``unit`` (data row, line) ``row_of(i)`` that holds id ``i``."""
    bad = idx < 0 if size is None else (idx < 0) | (idx >= size)
    if idx.size and bad.any():
        pos = int(np.argmax(bad))
        what = "negative row id" if idx[pos] < 0 else f"row id >= hash size {size}"
        raise InputError(f"{what} in column {name} at {unit} {row_of(pos)}",
                         source=src, field=name, value=int(idx[pos]))


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


def hash_values(values: Any) -> np.ndarray:
    """Fixed 64-bit hashes of string values (pandas' ``hash_array``), each distinct value of
    the chunk hashed once."""
    import pandas as pd
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(values)  # values: one pyarrow array (see _cells)
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


class ColumnarReader(Reader):
    """CSV files (a header line, ``,``-separated) and Parquet files: each chosen column a table.

    The catch-all format: it claims any file, below every reader that knows the file better.
    """

    def detect(self, path: Path) -> int:
        return BY_NAME if is_parquet(path) else ANY_FILE

    def tables(self, path: Path, options: ScanOptions, list_sep: str,
               first: tuple[TableSchema, ...] | None) -> tuple[Any, tuple[TableSchema, ...]]:
        return self.read_header(path, options, list_sep, CsvLayout(), options.columns)

    @staticmethod
    def read_header(path: Path, options: ScanOptions, list_sep: str, layout: CsvLayout,
                    columns: Sequence[str] | None) -> tuple[CsvLayout, tuple[TableSchema, ...]]:
        """The layout and tables of a file read with ``layout``."""
        plan = column_plan(path, columns, options.hash_size, options.ids, list_sep, layout)
        return layout, plan.tables()

    def pieces(self, file: FilePlan, piece_bytes: int) -> list[Piece]:
        path = Path(file.path)
        file_id = fingerprint(path)
        if is_parquet(path):
            return parquet_pieces(path, piece_bytes, file_id)
        header = 0
        if file.layout.names is None:
            with path.open("rb") as fh:
                header = len(fh.readline())
        return text_pieces(path, header, piece_bytes, file_id)

    def scan(self, file: FilePlan, piece: Piece, schema: ProfileSchema, sink: Sink) -> None:
        path = Path(file.path)
        columns = ColumnPlan.of(schema)
        batches: Iterator[Any]
        if is_parquet(path):
            groups = None if piece.whole else list(range(piece.start, piece.stop))
            batches = parquet_batches(path, list(columns.names), groups)
        else:
            span = None if piece.whole else (piece.start, piece.stop)
            batches = csv_batches(path, list(columns.names), file.layout, span)
        for table, idx, lengths, hashes in iter_lookups(batches, columns, piece.label):
            sink.add(table, idx, lengths)
            if hashes is not None:
                sink.add_raw(table, hashes)

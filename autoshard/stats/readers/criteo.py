"""Criteo display-advertising files: label, 13 dense columns I1-I13, 26 categorical C1-C26.

The original data is tab-separated without a header; exported samples are often CSV with a
header row. Both are detected from the first line. Each categorical column is one table; a cell
is one raw value (never split into multi-hot values), hashed into the table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoshard.errors import InputError
from autoshard.fileio import open_text
from autoshard.stats.partial import TableSchema
from autoshard.stats.readers import BY_CONTENT, NOT_MINE, ScanOptions
from autoshard.stats.readers.columnar import ColumnarReader, CsvLayout

DENSE = tuple(f"I{i}" for i in range(1, 14))
CATEGORICAL = tuple(f"C{i}" for i in range(1, 27))
COLUMNS = ("label", *DENSE, *CATEGORICAL)


def criteo_layout(path: str | Path) -> CsvLayout:
    """Delimiter (tab or comma) and whether the first line is a header."""
    path = Path(path)
    if not path.is_file():
        raise InputError("file not found", source=str(path))
    with open_text(path) as fh:
        first = fh.readline().rstrip("\r\n")
    if not first:
        raise InputError("file is empty", source=str(path))
    delimiter = "\t" if "\t" in first else ","
    fields = first.split(delimiter)
    if fields[0].strip().lower() == "label":
        return CsvLayout(delimiter, None)
    if len(fields) != len(COLUMNS):
        raise InputError(f"expected {len(COLUMNS)} columns (label, I1-I13, C1-C26)",
                         source=str(path), field="line 1", value=len(fields))
    return CsvLayout(delimiter, COLUMNS)


class CriteoReader(ColumnarReader):
    """Criteo TSV (no header) or CSV (a header starting with ``label``) files; by default the
    categorical columns C1-C26 are the tables."""

    keeps_cells_whole = True

    def detect(self, path: Path) -> int:
        """Known by its first line: a header starting with ``label``, or 40 tab-separated
        fields."""
        if not path.is_file():
            return NOT_MINE
        try:
            with open_text(path) as fh:
                first = fh.readline()
        except InputError:  # not text
            return NOT_MINE
        tabs = len(COLUMNS) - 1
        return BY_CONTENT if first.lower().startswith("label") or first.count("\t") == tabs \
            else NOT_MINE

    def tables(self, path: Path, options: ScanOptions, list_sep: str,
               first: tuple[TableSchema, ...] | None) -> tuple[Any, tuple[TableSchema, ...]]:
        return self.read_header(path, options, list_sep, criteo_layout(path),
                                options.columns or CATEGORICAL)

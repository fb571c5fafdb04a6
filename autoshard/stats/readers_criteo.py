"""Criteo display-advertising files: label, 13 dense columns I1-I13, 26 categorical C1-C26.

The original data is tab-separated without a header; exported samples are often CSV with a
header row. Both are detected from the first line. Each categorical column is one table.
"""

from __future__ import annotations

from pathlib import Path

from autoshard.errors import InputError
from autoshard.fileio import open_text
from autoshard.stats.readers_columnar import CsvLayout, Progress, profile_columnar
from autoshard.stats.table_stats import TableProfile

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


def profile_criteo(path: str | Path, hash_size: str | int | None = None,
                   columns: tuple[str, ...] = CATEGORICAL,
                   progress: Progress | None = None) -> list[TableProfile]:
    """Profiles the categorical columns, raw values hashed into ``hash_size`` rows."""
    return profile_columnar(path, columns=columns, hash_size=hash_size, list_sep="",
                            layout=criteo_layout(path), progress=progress)

"""Table statistics from lookup data: readers for traces and raw categorical files, the
profiler, and the calibration of the synthetic workload.

Profiling has one path, for one file or a dataset of many: :mod:`~autoshard.stats.readers`
(one :class:`~autoshard.stats.readers.Reader` per input format, found through a registry),
:mod:`~autoshard.stats.inputs` (files, folders, globs, pieces), :mod:`~autoshard.stats.scan`
(one schema, one piece counted), :mod:`~autoshard.stats.partial` (mergeable partial profiles,
saved as ``.npz``), :mod:`~autoshard.stats.sketch` (tables too large to count exactly) and
:mod:`~autoshard.stats.engine` (processes or Dask, resume, merge). ``autoshard profile`` runs it
on many files and cores; the functions here run it on one file, in this process.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autoshard.stats.table_stats import TableProfile, merged_reuse, profile_table

if TYPE_CHECKING:
    from autoshard.stats.engine import Advance


def profile_file(path: str | Path, fmt: str | None = None, hash_size: str | None = None,
                 hash_sizes: Sequence[int] | None = None, names: Sequence[str] | None = None,
                 columns: Sequence[str] | None = None, ids: bool = False,
                 advance: Advance | None = None) -> list[TableProfile]:
    """Profiles one file of any registered format in this process, through the same scan and
    merge as ``autoshard profile``.

    Args:
        path: Input file.
        fmt: A registered format (:func:`autoshard.stats.readers.reader_names`); detected from
            the file when ``None``.
        hash_size: Rows per table: ``"N"`` for all, ``"COL=N,..."`` per column, or both (a DLRM
            trace takes one global ``N``).
        hash_sizes: DLRM: hash size per table (e.g. from a table file).
        names: DLRM: table names (e.g. from a table file).
        columns: The categorical columns (features) to profile (default: the format's).
        ids: Every column holds row ids: none is hashed.
        advance: Called with the bytes and lookups of each piece of the file counted.

    Raises:
        InputError: An unknown format, or bad data (names the file, the field and the value).
    """
    from autoshard.stats.engine import EngineOptions, run_plan
    from autoshard.stats.scan import ScanOptions, plan_scan

    options = ScanOptions(fmt=fmt, hash_size=hash_size,
                          hash_sizes=None if hash_sizes is None else tuple(hash_sizes),
                          names=None if names is None else tuple(names),
                          columns=None if columns is None else tuple(columns), ids=ids)
    plan = plan_scan([Path(path)], options)
    return run_plan(plan, EngineOptions(), advance).profiles()


def profile_trace_file(path: str | Path, hash_sizes: Sequence[int] | int | None = None,
                       names: Sequence[str] | None = None) -> list[TableProfile]:
    """Profiles every table of a DLRM trace file (:func:`profile_file`); ``hash_sizes`` is one
    per table, one for all, or None (each table's largest row id + 1)."""
    if isinstance(hash_sizes, int):
        return profile_file(path, "dlrm", hash_size=str(hash_sizes), names=names)
    return profile_file(path, "dlrm", hash_sizes=hash_sizes, names=names)


def profile_criteo(path: str | Path, hash_size: str | int | None = None,
                   columns: Sequence[str] | None = None) -> list[TableProfile]:
    """Profiles the categorical columns (C1-C26 unless ``columns`` are given) of a Criteo file,
    raw values hashed into ``hash_size`` rows (:func:`profile_file`)."""
    return profile_file(path, "criteo", None if hash_size is None else str(hash_size),
                        columns=columns)


def profile_columnar(path: str | Path, columns: Sequence[str] | None = None,
                     hash_size: str | int | None = None, ids: bool = False
                     ) -> list[TableProfile]:
    """Profiles each chosen column of a CSV or Parquet file as a table (:func:`profile_file`)."""
    return profile_file(path, "columnar", None if hash_size is None else str(hash_size),
                        columns=columns, ids=ids)


__all__ = ["TableProfile", "merged_reuse", "profile_columnar", "profile_criteo",
           "profile_file", "profile_table", "profile_trace_file"]

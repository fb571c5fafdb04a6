"""Table statistics from lookup data: readers for traces and raw categorical files, the
profiler, and the calibration of the synthetic workload.

A dataset of many files: :mod:`~autoshard.stats.inputs` (files, folders, globs, pieces),
:mod:`~autoshard.stats.scan` (one schema, one piece counted), :mod:`~autoshard.stats.partial`
(mergeable partial profiles, saved as ``.npz``), :mod:`~autoshard.stats.sketch` (tables too
large to count exactly) and :mod:`~autoshard.stats.engine` (processes or Dask, resume, merge).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from autoshard.errors import InputError
from autoshard.fileio import open_text
from autoshard.stats.table_stats import TableProfile, merged_reuse, profile_table

FORMATS = ("dlrm", "criteo", "columnar")


def detect_format(path: str | Path) -> str:
    """``dlrm`` for .pt/.pt.gz, ``columnar`` for Parquet, else ``criteo`` when the first line
    looks like Criteo (header starting with label, or 40 tab-separated fields), else columnar."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith((".pt", ".pt.gz", ".pth")):
        return "dlrm"
    if name.endswith((".parquet", ".pq")):
        return "columnar"
    if path.is_file():
        with open_text(path) as fh:
            first = fh.readline()
        if first.lower().startswith("label") or first.count("\t") == 39:
            return "criteo"
    return "columnar"


def profile_trace_file(path: str | Path, hash_sizes: Sequence[int] | int | None = None,
                       names: Sequence[str] | None = None,
                       progress: Callable[[int], None] | None = None) -> list[TableProfile]:
    """Profiles every table of a DLRM trace file, one table at a time."""
    from autoshard.stats.readers_dlrm import iter_tables, load_trace

    trace = load_trace(path)
    if trace.batch_size == 0 or trace.indices.size == 0:
        what = "no samples" if trace.batch_size == 0 else "no lookups"
        raise InputError(f"trace has {what}: nothing to measure", source=str(path),
                         field="lengths", value=tuple(trace.lengths.shape))
    if isinstance(hash_sizes, int):
        hash_sizes = [hash_sizes] * trace.num_tables
    for what, given in (("hash sizes", hash_sizes), ("table names", names)):
        if given is not None and len(given) != trace.num_tables:
            raise InputError(f"{len(given)} {what} given for {trace.num_tables} tables",
                             source=str(path), field=what, value=len(given))
    profiles = []
    for t, indices, lengths, size in iter_tables(trace, hash_sizes):
        name = names[t] if names is not None else f"t{t}"
        profiles.append(profile_table(name, indices, lengths, size))
        if progress is not None:
            progress(indices.size)
    return profiles


def profile_file(path: str | Path, fmt: str | None = None, hash_size: str | None = None,
                 hash_sizes: Sequence[int] | None = None, names: Sequence[str] | None = None,
                 columns: Sequence[str] | None = None,
                 progress: Callable[[int], None] | None = None) -> list[TableProfile]:
    """Profiles a trace (``dlrm``), a Criteo file or a CSV/Parquet file (``columnar``).

    Args:
        path: Input file.
        fmt: One of :data:`FORMATS`; detected from the file when ``None``.
        hash_size: Criteo/columnar: ``"N"``, ``"COL=N,..."`` or both; DLRM: one global ``N``.
        hash_sizes: DLRM: hash size per table (e.g. from a table file).
        names: DLRM: table names (e.g. from a table file).
        columns: Criteo/columnar: the categorical columns to profile.
        progress: Called with the lookups (DLRM) or rows (others) done so far, per step.
    """
    fmt = fmt or detect_format(path)
    if fmt == "dlrm":
        sizes: Sequence[int] | int | None = hash_sizes
        if hash_size is not None and hash_sizes is None:
            try:
                sizes = int(hash_size)
            except ValueError:
                raise InputError("a DLRM trace takes one global hash size (or a table file)",
                                 field="hash_size", value=hash_size) from None
        return profile_trace_file(path, sizes, names, progress)
    if fmt == "criteo":
        from autoshard.stats.readers_criteo import CATEGORICAL, profile_criteo

        return profile_criteo(path, hash_size, tuple(columns or CATEGORICAL), progress)
    if fmt == "columnar":
        from autoshard.stats.readers_columnar import profile_columnar

        return profile_columnar(path, columns, hash_size, progress=progress)
    raise InputError(f"unknown format (known: {', '.join(FORMATS)})", field="format", value=fmt)


__all__ = ["FORMATS", "TableProfile", "detect_format", "merged_reuse", "profile_file",
           "profile_table", "profile_trace_file"]

"""Rows of the comparison harness and its CSV files: what a row records, reading a file back
strictly (a file the harness did not write is an error naming it, never replaced), and the
compatibility of files written before later columns existed.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autoshard.errors import InputError
from autoshard.fileio import (
    append_csv_row,
    atomic_write_text,
    check_csv_header,
    csv_text,
    read_text,
)


@dataclass(frozen=True)
class CompareRow:
    """One sharder on one task: ``status`` is ok, failed (with the reason) or skipped.

    ``machine`` (:func:`autoshard.machine.describe_machine`) and ``measured_at`` (UTC, ISO 8601)
    say where and when the row was measured; files written before they were recorded leave
    them empty. ``reused_from`` is empty when the run that wrote the file measured the row, else
    the CSV the row was reused from. ``notes`` are what the sharder said of an ok row's plan
    (what its time limit cut, say), joined by ``; ``.
    """

    suite: str
    task: str
    tables: int
    devices: int
    mode: str
    sharder: str
    status: str
    reason: str = ""
    step_cost_ms: float = float("nan")
    lower_bound_ms: float = float("nan")
    cost_ratio: float = float("nan")
    load_balance: float = float("nan")
    uvm_lookup_share: float = float("nan")
    plan_seconds: float = float("nan")
    cost_model: str = ""
    cost_model_id: str = ""
    options: str = ""
    found_by: str = ""
    machine: str = ""
    measured_at: str = ""
    reused_from: str = ""
    notes: str = ""

    @property
    def reused(self) -> bool:
        """Whether the run that wrote the file took this row from an earlier run."""
        return bool(self.reused_from)

    def provenance(self) -> str:
        """Where and when the row was measured, in words where it does not record them."""
        return (f"measured on {self.machine or 'an unrecorded machine'} at "
                f"{self.measured_at or 'an unrecorded time'}")


COLUMNS = [f.name for f in fields(CompareRow)]
_FLOATS = {f.name for f in fields(CompareRow) if f.type in ("float", float)}
#: Columns added after the first results were written, which older files lack, and the value
#: such a row reads as (a column's name: that column's value; empty: empty).
_LATER = {"cost_model_id": "cost_model", "options": "", "found_by": "", "machine": "",
          "measured_at": "", "reused_from": "", "notes": ""}
STATUSES = ("ok", "failed", "skipped")
#: The figures of an ok row; a row with any of them not finite is never kept or reused.
FIGURES = ("step_cost_ms", "lower_bound_ms", "cost_ratio", "load_balance", "uvm_lookup_share",
           "plan_seconds")
#: The outputs written beside a suite's CSV, as suffixes of the suite's name: replaced only
#: when that CSV is the harness's.
BESIDE = (".md", ".png", ".devices.png", ".devices.json", ".torchrec.csv", ".torchrec.md")


def utc_now() -> str:
    """This moment, UTC, ISO 8601 to the second: ``2026-12-01T14:09:00+00:00``."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def finite(row: CompareRow) -> bool:
    """Whether every figure of an ok row is finite (failed and skipped rows have none)."""
    return row.status != "ok" or all(math.isfinite(getattr(row, f)) for f in FIGURES)


def read_rows(path: Path) -> list[CompareRow]:
    """Rows of a results CSV (none when there is no file). A torn last line, left by an
    interrupted write (the file does not end in a newline), is dropped.

    Raises:
        InputError: The file is not one the harness wrote: unreadable as text, a header that
            is not a comparison CSV's, or a row that does not parse. The error names the file.
    """
    if not path.is_file():
        return []
    try:
        text = read_text(path)
        reader = csv.DictReader(io.StringIO(text))
        header = check_csv_header(reader.fieldnames, str(path))
        raws = list(reader)
    except InputError as exc:
        raise _foreign(path, exc.reason) from exc
    except csv.Error as exc:
        raise _foreign(path, f"not a CSV ({exc})") from exc
    missing = [c for c in COLUMNS if c not in header and c not in _LATER]
    extra = [c for c in header if c not in COLUMNS]
    if missing or extra:
        what = f"no column {missing[0]!r}" if missing else f"an unknown column {extra[0]!r}"
        raise _foreign(path, f"its header has {what}")
    rows = []
    for number, raw in enumerate(raws, start=1):
        try:
            rows.append(_parse(raw))
        except ValueError as exc:
            if number < len(raws) or text.endswith("\n"):
                raise _foreign(path, f"row {number} does not parse ({exc})") from exc
    if raws and not text.endswith("\n") and len(rows) == len(raws):
        rows.pop()  # torn while written: its last field may be cut short
    return rows


def _foreign(path: Path, why: str) -> InputError:
    return InputError(f"not a CSV that `autoshard compare` wrote: {why}; it and the files "
                      "beside it are left as they are (move them or choose another folder)",
                      source=str(path))


def _parse(raw: dict[Any, str | None]) -> CompareRow:
    """One CSV record as a row; ValueError when it does not parse."""
    if None in raw or None in raw.values():
        raise ValueError("wrong number of fields")
    values: dict[str, Any] = {}
    for name in COLUMNS:  # the header check leaves only later columns to be missing
        later = _LATER.get(name, "")
        values[name] = raw[name] if name in raw else (raw.get(later) or "" if later else "")
    for name in _FLOATS:
        values[name] = float(values[name])
    values["tables"] = int(values["tables"])
    values["devices"] = int(values["devices"])
    if values["status"] not in STATUSES:
        raise ValueError(f"status {values['status']!r}")
    return CompareRow(**values)


def append_row(path: Path, row: CompareRow) -> None:
    append_csv_row(path, asdict(row), COLUMNS)


def rewrite_rows(path: Path, rows: Iterable[CompareRow]) -> None:
    """Rewrites the CSV with only complete rows (drops a torn last line before appending)."""
    atomic_write_text(path, csv_text((asdict(r) for r in rows), COLUMNS))


def check_outputs(out_dir: Path, suite: str) -> list[CompareRow]:
    """The rows of ``out_dir/<suite>.csv``, having checked that the harness wrote every file
    of the suite there that a run would replace (:data:`BESIDE`).

    Raises:
        InputError: The CSV is not a comparison CSV, or one of the files beside it is there
            without the harness's CSV; the error names the file.
    """
    path = out_dir / f"{suite}.csv"
    if path.exists() and not path.is_file():
        raise _foreign(path, "it is not a regular file")
    if path.is_file():
        return read_rows(path)
    for suffix in BESIDE:
        other = out_dir / f"{suite}{suffix}"
        if other.exists() or other.is_symlink():
            raise InputError(f"no {path.name} of `autoshard compare` beside it, so the harness "
                             "did not write it; it is left as it is (move it or choose another "
                             "folder)", source=str(other))
    return []

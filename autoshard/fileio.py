"""Reading structured files (JSON/YAML) and writing outputs atomically."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autoshard.errors import InputError

SCHEMA_VERSION = 1
PLAN_SCHEMA_VERSION = 2  # plans that split tables into shards; version 1 plans still load


def read_structured(path: str | Path) -> Any:
    """Reads a JSON or YAML file (chosen by suffix) into Python values.

    Raises:
        InputError: The file is missing, empty or not parseable.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("file not found", source=str(path))
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}".splitlines()[0], source=str(path)) from exc
    if not text.strip():
        raise InputError("file is empty", source=str(path))
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(text)
        return json.loads(text)
    except Exception as exc:  # parse errors of either library
        raise InputError(f"cannot parse: {exc}".splitlines()[0], source=str(path)) from exc


def check_schema(doc: Any, kind: str, source: str,
                 versions: tuple[int, ...] = (SCHEMA_VERSION,)) -> dict[str, Any]:
    """Checks a document is a mapping of the expected kind and one of the schema ``versions``
    this autoshard reads (a document without a version is taken as the newest)."""
    if not isinstance(doc, dict):
        raise InputError(f"expected a mapping for a {kind} document", source=source)
    version = doc.get("schema_version", versions[-1])
    if isinstance(version, bool) or version not in versions:
        readable = ", ".join(str(v) for v in versions)
        raise InputError(
            f"unsupported schema version (this autoshard reads {readable})",
            source=source,
            field="schema_version",
            value=version,
        )
    found = doc.get("kind", kind)
    if found != kind:
        raise InputError(f"expected a '{kind}' document", source=source, field="kind", value=found)
    return doc


def atomic_write_text(path: str | Path, text: str) -> None:
    """Writes text to path via a temporary file and rename, so no half-written file is left."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_structured(path: str | Path, doc: Any) -> None:
    """Writes a document as JSON or YAML (by suffix), atomically."""
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        text = yaml.safe_dump(doc, sort_keys=False)
    else:
        text = json.dumps(doc, indent=2) + "\n"
    atomic_write_text(path, text)


def csv_text(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Rows as CSV text with a header line (write it with :func:`atomic_write_text`)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def append_csv_row(path: Path, row: Mapping[str, Any], columns: Sequence[str]) -> None:
    """Appends one row to a results CSV (header first when the file is new or empty) and flushes,
    so an interrupted run loses at most the row being written."""
    new = not path.is_file() or path.stat().st_size == 0
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns))
        if new:
            writer.writeheader()
        writer.writerow(row)
        fh.flush()

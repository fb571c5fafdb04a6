"""Reading input files and writing outputs: the one place both rules live.

Reading: a text input (a CSV, a reference file, JSON or YAML) is UTF-8, a leading byte-order
mark dropped; a file that is not text (not UTF-8, or holding NUL bytes) is an
:class:`~autoshard.errors.InputError` naming it, never a traceback. A CSV header repeats no
column name (:func:`check_csv_header`).

Writing: every output file goes through :func:`write_output` (text, structured documents,
figures, tensors, CSV rows), which decides what a path means:

- a regular file, or a path that does not exist yet, is written atomically: into a temporary
  file beside it, then renamed over it, so a reader never sees half a file and a failed write
  leaves the old file as it was. An existing file keeps its permission bits (and, for root, its
  owner); a new file gets ``0o666`` less the umask, as ``open()`` would give it;
- a symbolic link is followed: the file it points to is written (atomically, as above) and the
  link is kept;
- an existing device or FIFO (any path that is neither a regular file nor a folder) is written
  directly, without a rename: ``-o /dev/null`` discards the output, ``-o /dev/stdout`` prints
  it, a FIFO waits for its reader. A write error (``ENOSPC`` on ``/dev/full``) is an error
  naming the path, never a reported success;
- a folder is refused with an error naming it.

Every JSON document is strict (``allow_nan=False``): :func:`check_finite` walks a document
before it is written or printed and names the field that holds a NaN or an infinity.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import numbers
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from autoshard.errors import InputError

SCHEMA_VERSION = 1
PLAN_SCHEMA_VERSION = 2  # plans that split tables into shards; version 1 plans still load
#: Bytes read from the start of a text input to tell a binary file (it holds a NUL byte).
SNIFF_BYTES = 8192


# Reading ----------------------------------------------------------------------------------------


def _not_text(path: Path, exc: UnicodeDecodeError | None = None) -> InputError:
    """The error for a text input that is not UTF-8 text."""
    detail = f"byte 0x{exc.object[exc.start]:02x} is not UTF-8" if exc else "it holds NUL bytes"
    return InputError(f"cannot read: not a text file ({detail}); is it a binary file?",
                      source=str(path))


def _check_readable(path: Path) -> None:
    """Refuses a missing input, and one that is not a regular file (a folder, a device)."""
    if not path.exists():
        raise InputError("file not found", source=str(path))
    if not path.is_file():
        raise InputError("not a regular file", source=str(path))


def read_text(path: str | Path) -> str:
    """The text of a UTF-8 file, a leading byte-order mark dropped.

    Raises:
        InputError: The file is missing, unreadable, not UTF-8 or holds NUL bytes (binary).
    """
    path = Path(path)
    _check_readable(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror or exc})", source=str(path)) from exc
    if b"\0" in data:
        raise _not_text(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _not_text(path, exc) from exc


@contextlib.contextmanager
def open_text(path: str | Path) -> Iterator[IO[str]]:
    """Opens a UTF-8 text file for reading as a stream (a leading byte-order mark dropped,
    ``newline=""`` for the csv module).

    A NUL byte in the first :data:`SNIFF_BYTES` bytes, or a decoding error met anywhere while the
    caller reads inside the ``with`` block, is an InputError naming the file.

    Raises:
        InputError: The file is missing, unreadable or not UTF-8 text.
    """
    path = Path(path)
    _check_readable(path)
    try:
        with path.open("rb") as raw:
            if b"\0" in raw.read(SNIFF_BYTES):
                raise _not_text(path)
        with path.open(encoding="utf-8-sig", newline="") as fh:
            yield fh
    except UnicodeDecodeError as exc:
        raise _not_text(path, exc) from exc
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror or exc})", source=str(path)) from exc


def check_csv_header(columns: Sequence[str | None] | None, source: str) -> list[str]:
    """The header's column names, stripped; refuses a missing header and repeated names.

    Raises:
        InputError: No header, or a column name given twice (the error names it).
    """
    if not columns:
        raise InputError("no header line (the file is empty)", source=source)
    names = [(c or "").strip() for c in columns]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InputError("column named twice in the header", source=source,
                             field=name or None, value=None if name else name)
        seen.add(name)
    return names


def read_structured(path: str | Path) -> Any:
    """Reads a JSON or YAML file (chosen by suffix) into Python values.

    Raises:
        InputError: The file is missing, empty, not text or not parseable.
    """
    path = Path(path)
    text = read_text(path)
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


# Strict documents -------------------------------------------------------------------------------


def _non_finite(doc: Any, where: str) -> tuple[str, Any] | None:
    """(field path, value) of the first NaN or infinity in ``doc``, or None."""
    if isinstance(doc, Mapping):
        for key, value in doc.items():
            found = _non_finite(value, f"{where}.{key}" if where else str(key))
            if found:
                return found
    elif isinstance(doc, (list, tuple)):
        for i, value in enumerate(doc):
            found = _non_finite(value, f"{where}[{i}]")
            if found:
                return found
    elif (isinstance(doc, numbers.Real) and not isinstance(doc, numbers.Integral)
          and not math.isfinite(float(doc))):
        return where or "(document)", doc
    return None


def check_finite(doc: Any, source: str) -> None:
    """Refuses a document holding a NaN or an infinity anywhere; the error names the field
    path (``all.spearman``, ``tables[3].zipf_alpha``)."""
    found = _non_finite(doc, "")
    if found:
        raise InputError("not a finite number (NaN and infinities are never written)",
                         source=source, field=found[0], value=found[1])


def json_text(doc: Any, indent: int | None = 2, source: str = "output") -> str:
    """``doc`` as strict JSON text ending in a newline (see :func:`check_finite`)."""
    check_finite(doc, source)
    return json.dumps(doc, indent=indent, allow_nan=False) + "\n"


def write_structured(path: str | Path, doc: Any) -> None:
    """Writes a document as JSON or YAML (by suffix) through :func:`write_output`; a NaN or an
    infinity anywhere in it is refused (naming the field) and nothing is written."""
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        check_finite(doc, str(path))
        text = yaml.safe_dump(doc, sort_keys=False)
    else:
        text = json_text(doc, source=str(path))
    atomic_write_text(path, text)


# Outputs ----------------------------------------------------------------------------------------


def current_umask() -> int:
    """This process's umask: from ``/proc/self/status`` where Linux gives it, else by setting and
    restoring it (``os.umask`` has no read-only form; that is racy if another thread creates
    files at the same moment, acceptable for a command-line tool)."""
    with (contextlib.suppress(OSError, ValueError),
          open("/proc/self/status", encoding="utf-8", errors="replace") as fh):
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def output_target(path: str | Path, source: str | None = None, field: str | None = None
                  ) -> tuple[Path, os.stat_result | None]:
    """Where writing ``path`` lands: for a regular file or a new one, the real path (symbolic
    links followed); for a device or FIFO, ``path`` itself; with its status, or None when it
    does not exist yet.

    Raises:
        InputError: The target is a folder, or cannot be reached (a file used as a folder, a
            link loop); ``source`` and ``field`` say where the path came from (by default the
            error names the path itself).
    """
    path = Path(path)
    where = {"source": source or str(path), "field": field, "value": str(path) if source else None}
    try:
        status: os.stat_result | None = path.stat()  # links followed
    except FileNotFoundError:
        status = None
    except OSError as exc:  # a link loop, a file used as a folder, no permission
        raise InputError(f"cannot write there ({exc.strerror or exc})", **where) from exc
    if status is not None and stat.S_ISDIR(status.st_mode):
        raise InputError("is a folder; give a file name", **where)
    if status is not None and not stat.S_ISREG(status.st_mode):
        return path, status  # opened by its own name: /dev/stdout's link names no real path
    return Path(os.path.realpath(path)), status


def write_output(path: str | Path, write: Callable[[IO[bytes]], object]) -> None:
    """Writes an output file with ``write(fh)`` (given a binary file to write to), as the module
    docstring says: atomically at a regular path (or a link's target), directly into a device
    or FIFO, refused for a folder. Folders above the file are created (and removed again if
    the write fails).

    Raises:
        InputError: The path is a folder, or the write failed (names the path and the reason).
    """
    target, status = output_target(path)
    if status is not None and not stat.S_ISREG(status.st_mode):
        _write_special(Path(path), target, write)
        return
    created = _make_folders(target.parent)
    try:
        _write_atomically(target, status, write)
    except OSError as exc:
        _remove_folders(created, target.parent)
        raise InputError(f"cannot write ({exc.strerror or exc})", source=str(path)) from exc
    except BaseException:
        _remove_folders(created, target.parent)
        raise


def _write_special(path: Path, target: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Writes straight into an existing device or FIFO (no rename, which would replace it)."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_NOCTTY)
        with os.fdopen(fd, "wb") as fh:
            write(fh)
    except OSError as exc:
        raise InputError(f"cannot write ({exc.strerror or exc})", source=str(path)) from exc


def _write_atomically(target: Path, status: os.stat_result | None,
                      write: Callable[[IO[bytes]], object]) -> None:
    """Temporary file beside ``target``, the old file's mode (or the umask's), then a rename."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            if status is None:
                os.fchmod(fh.fileno(), 0o666 & ~current_umask())
            else:
                os.fchmod(fh.fileno(), stat.S_IMODE(status.st_mode) & 0o777)
                if os.geteuid() == 0 and (status.st_uid, status.st_gid) != (0, os.getgid()):
                    with contextlib.suppress(OSError):
                        os.fchown(fh.fileno(), status.st_uid, status.st_gid)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _make_folders(folder: Path) -> Path | None:
    """Creates ``folder`` and its missing parents; returns the topmost one created, if any."""
    top = None
    for parent in (folder, *folder.parents):
        if parent.exists():
            break
        top = parent
    folder.mkdir(parents=True, exist_ok=True)
    return top


def _remove_folders(top: Path | None, folder: Path) -> None:
    """Removes the empty folders from ``folder`` up to ``top`` (those a failed write made)."""
    if top is None:
        return
    with contextlib.suppress(OSError):
        for parent in (folder, *folder.parents):
            parent.rmdir()
            if parent == top:
                break


def atomic_write_text(path: str | Path, text: str) -> None:
    """Writes UTF-8 text to ``path`` through :func:`write_output` (atomic at a regular path)."""
    data = text.encode("utf-8")
    write_output(path, lambda fh: fh.write(data))


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> None:
    """Saves a matplotlib figure through :func:`write_output`, in the format of the suffix."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    write_output(path, lambda fh: fig.savefig(fh, format=fmt, dpi=dpi))


def csv_text(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Rows as CSV text with a header line (write it with :func:`atomic_write_text`)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def append_csv_row(path: Path, row: Mapping[str, Any], columns: Sequence[str]) -> None:
    """Appends one row to a results CSV (header first when the file is new or empty) and flushes,
    so an interrupted run loses at most the row being written. Appending follows a link and
    writes a device or FIFO directly, as :func:`write_output` does; a folder is refused."""
    target, status = output_target(path)
    new = status is None or not stat.S_ISREG(status.st_mode) or status.st_size == 0
    if status is None:
        target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with target.open("a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(columns))
            if new:
                writer.writeheader()
            writer.writerow(row)
            fh.flush()
    except OSError as exc:
        raise InputError(f"cannot write ({exc.strerror or exc})", source=str(path)) from exc


# Folders and several outputs --------------------------------------------------------------------


@contextlib.contextmanager
def output_folder(path: str | Path) -> Iterator[Path]:
    """A folder for a command's several files that exists afterwards only if the command
    succeeds: a folder this call creates (with any missing parents) is removed again, with all
    it holds, when the ``with`` block raises. An existing folder is used as it is; its files
    are each written atomically, so a failure leaves each old file whole.

    Raises:
        InputError: ``path`` is a file, not a folder.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError("is a file; give a folder", source=str(path))
    top = _make_folders(path)
    try:
        yield path
    except BaseException:
        if top is not None:
            shutil.rmtree(top, ignore_errors=True)
        raise


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two output paths land on one file (links followed; hard links too)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_distinct_outputs(outputs: Mapping[str, str | Path | None],
                           source: str = "command line") -> None:
    """Refuses two outputs (by option name; None for one not given) that name the same file.

    Raises:
        InputError: Naming both options and the path.
    """
    given = [(option, path) for option, path in outputs.items() if path is not None]
    for i, (first, a) in enumerate(given):
        for second, b in given[i + 1:]:
            if same_file(a, b):
                raise InputError(f"{first} and {second} name the same file; give each its own",
                                 source=source, field=second, value=str(b))

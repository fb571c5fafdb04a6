"""Meta's open DLRM lookup traces: ``indices, offsets, lengths = torch.load(f)``.

``lengths`` is shaped [T, B] (lookups of table t in sample b), ``offsets`` has T*B+1 entries and
the layout is table-major: table t's lookups are ``indices[offsets[t*B]:offsets[(t+1)*B]]``.
Plain ``.pt`` files are memory-mapped; ``.pt.gz`` files are first decompressed to a temporary
file, so a trace of several GB is never held in memory twice. A trace is one piece: its tables are
read from one memory-mapped file.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from autoshard.errors import InputError
from autoshard.fileio import write_output
from autoshard.stats.inputs import Piece
from autoshard.stats.partial import ProfileSchema, TableSchema
from autoshard.stats.readers import FilePlan, Reader, ScanOptions, Sink


@dataclass(frozen=True)
class Trace:
    """A lookup trace held as numpy arrays (possibly memory-mapped).

    Args:
        indices: All lookups, table-major.
        offsets: T*B+1 start positions.
        lengths: Lookups per table and sample, [T, B].
        source: Where it came from, for error messages.
    """

    indices: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    source: str = "<trace>"

    @property
    def num_tables(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[1])

    def table(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Table ``t``'s lookups and its lookups per sample."""
        b = self.batch_size
        start, stop = int(self.offsets[t * b]), int(self.offsets[(t + 1) * b])
        return self.indices[start:stop], self.lengths[t]

    def check(self) -> None:
        """Checks the three arrays agree; errors name the table and sample."""
        src = self.source
        if self.lengths.ndim != 2:
            raise InputError("lengths must be 2-D [tables, batch]", source=src,
                             field="lengths", value=tuple(self.lengths.shape))
        t, b = self.lengths.shape
        if self.offsets.ndim != 1 or self.offsets.size != t * b + 1:
            raise InputError(f"offsets must have tables*batch+1 = {t * b + 1} entries",
                             source=src, field="offsets", value=int(self.offsets.size))
        if self.indices.ndim != 1:
            raise InputError("indices must be 1-D", source=src, field="indices",
                             value=tuple(self.indices.shape))
        if self.offsets[0] != 0 or self.offsets[-1] != self.indices.size:
            raise InputError(f"offsets must run from 0 to len(indices) = {self.indices.size}",
                             source=src, field="offsets",
                             value=(int(self.offsets[0]), int(self.offsets[-1])))
        bad = np.flatnonzero(np.diff(self.offsets) != self.lengths.reshape(-1))
        if bad.size:
            table, sample = divmod(int(bad[0]), b)
            raise InputError(
                f"lengths disagree with offsets at table {table}, sample {sample}",
                source=src, field=f"lengths[{table}][{sample}]",
                value=int(self.lengths[table, sample]))


def load_trace(path: str | Path) -> Trace:
    """Reads a trace file (``.pt`` or ``.pt.gz``) and checks its arrays agree."""
    path = Path(path)
    if not path.is_file():
        raise InputError("file not found", source=str(path))
    if path.stat().st_size == 0:
        raise InputError("file is empty", source=str(path))
    with _plain_copy(path) as plain:
        data = _torch_load(plain, str(path))
    trace = _as_trace(data, str(path))
    trace.check()
    return trace


def save_trace(path: str | Path, indices: np.ndarray, offsets: np.ndarray,
               lengths: np.ndarray) -> None:
    """Writes a trace in Meta's format (gzipped when the name ends in ``.gz``) through
    :func:`autoshard.fileio.write_output` (atomically at a regular path)."""
    import torch

    path = Path(path)
    tensors = (torch.from_numpy(np.ascontiguousarray(indices, dtype=np.int64)),
               torch.from_numpy(np.ascontiguousarray(offsets, dtype=np.int64)),
               torch.from_numpy(np.ascontiguousarray(lengths, dtype=np.int64)))

    def write(fh: IO[bytes]) -> None:
        if path.suffix == ".gz":
            with gzip.GzipFile(fileobj=fh, mode="wb", compresslevel=1) as packed:
                torch.save(tensors, packed)  # type: ignore[arg-type]
        else:
            torch.save(tensors, fh)

    write_output(path, write)


def iter_tables(trace: Trace, hash_sizes: Sequence[int] | None = None
                ) -> Iterator[tuple[int, np.ndarray, np.ndarray, int]]:
    """Yields (table, lookups, lookups per sample, hash size), each table's indices checked."""
    for t in range(trace.num_tables):
        indices, lengths = trace.table(t)
        declared = None if hash_sizes is None else int(hash_sizes[t])
        yield t, indices, lengths, check_indices(indices, declared, trace.source, f"table {t}",
                                                 int(trace.offsets[t * trace.batch_size]))


def check_indices(indices: np.ndarray, hash_size: int | None, source: str, table: str,
                  start: int = 0) -> int:
    """Checks indices lie in [0, hash_size) and returns the hash size (max + 1 if undeclared).

    Errors name the table and the position of the first bad index in the file's indices.
    """
    if indices.size == 0:
        return hash_size or 1
    low, high = int(indices.min()), int(indices.max())
    if low < 0:
        pos = int(np.argmax(indices < 0))
        raise InputError(f"negative index in {table} at position {start + pos}", source=source,
                         field=f"{table}.indices[{start + pos}]", value=int(indices[pos]))
    if hash_size is not None and high >= hash_size:
        pos = int(np.argmax(indices >= hash_size))
        raise InputError(f"index >= hash size {hash_size} in {table} at position {start + pos}",
                         source=source, field=f"{table}.indices[{start + pos}]",
                         value=int(indices[pos]))
    return hash_size if hash_size is not None else high + 1


@contextmanager
def _plain_copy(path: Path) -> Iterator[Path]:
    """The path itself, or a decompressed temporary copy of a gzip file."""
    if path.suffix != ".gz":
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="autoshard-trace-") as tmp:
        plain = Path(tmp) / path.stem
        try:
            with gzip.open(path, "rb") as src, plain.open("wb") as dst:
                shutil.copyfileobj(src, dst, length=16 << 20)
        except (OSError, EOFError) as exc:
            raise InputError(f"truncated or corrupt gzip file ({exc})", source=str(path)) from exc
        yield plain


def _torch_load(path: Path, source: str) -> Any:
    import torch

    try:
        return torch.load(path, mmap=True, weights_only=True)
    except Exception as mmap_exc:  # legacy (non-zip) files cannot be memory-mapped
        try:
            return torch.load(path, weights_only=True)
        except Exception as exc:
            raise InputError(f"cannot read trace, truncated or not a torch file ({mmap_exc})"
                             .splitlines()[0], source=source) from exc


def _as_trace(data: Any, source: str) -> Trace:
    import torch

    if not isinstance(data, (tuple, list)) or len(data) != 3:
        raise InputError("expected (indices, offsets, lengths)", source=source,
                         field="trace", value=type(data).__name__)
    arrays = []
    for name, item in zip(("indices", "offsets", "lengths"), data, strict=True):
        if not isinstance(item, torch.Tensor) or item.is_floating_point():
            raise InputError("expected an integer tensor", source=source, field=name,
                             value=getattr(item, "dtype", type(item).__name__))
        arrays.append(item.numpy())
    return Trace(arrays[0], arrays[1], arrays[2], source)


class TraceReader(Reader):
    """Meta's DLRM traces (``.pt``, ``.pt.gz``): table ``t`` of the trace is a table, named and
    sized by the table file (``names``, ``hash_sizes``), else ``t0``, ``t1``, ... with one
    global hash size or none (the largest row id + 1)."""

    suffixes = (".pt", ".pt.gz", ".pth")

    def tables(self, path: Path, options: ScanOptions, list_sep: str,
               first: tuple[TableSchema, ...] | None) -> tuple[Any, tuple[TableSchema, ...]]:
        """The tables of the table file, else of the first trace (a later trace's tables are
        checked when it is counted: finding them means reading it all)."""
        if first is not None:
            return None, first
        sizes: tuple[int | None, ...]
        if options.hash_sizes is not None:
            sizes = options.hash_sizes
        else:
            sizes = (_global_size(options.hash_size),) * load_trace(path).num_tables
        names = options.names or tuple(f"t{t}" for t in range(len(sizes)))
        if len(names) != len(sizes):
            raise InputError(f"{len(names)} table names given for {len(sizes)} tables",
                             source=str(path), field="names", value=len(names))
        return None, tuple(TableSchema(n, s, False, False)
                           for n, s in zip(names, sizes, strict=True))

    def scan(self, file: FilePlan, piece: Piece, schema: ProfileSchema, sink: Sink) -> None:
        path = Path(file.path)
        trace = load_trace(path)
        if trace.batch_size == 0 or trace.indices.size == 0:
            what = "no samples" if trace.batch_size == 0 else "no lookups"
            raise InputError(f"trace has {what}: nothing to measure", source=str(path),
                             field="lengths", value=tuple(trace.lengths.shape))
        if trace.num_tables != len(schema.tables):
            raise InputError(f"{trace.num_tables} tables, expected {len(schema.tables)} (as the "
                             "table file or the first trace)", source=str(path),
                             field="lengths", value=trace.num_tables)
        sizes = [t.hash_size for t in schema.tables]
        declared = None if any(s is None for s in sizes) else [int(s or 0) for s in sizes]
        for t, indices, lengths, _ in iter_tables(trace, declared):
            sink.add(t, np.asarray(indices, dtype=np.int64), lengths)


def _global_size(spec: str | None) -> int | None:
    if spec is None:
        return None
    try:
        return int(spec)
    except ValueError:
        raise InputError("a DLRM trace takes one global hash size (or a table file)",
                         source="command line", field="--hash-size", value=spec) from None

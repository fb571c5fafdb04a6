"""Which files a profile reads, and the pieces they are cut into for parallel work.

An input is a file, a folder (every file in it, not hidden, in name order; not recursive) or a
glob (``data/day_*.tsv``). The expanded list is sorted and has no repeats. Each file is cut into
pieces that workers profile independently and whose counts are added afterwards, as its reader
says (:meth:`autoshard.stats.readers.Reader.pieces`), with the cuts made here:

- a text file (Criteo, CSV, JSON lines) into byte ranges of whole lines of about
  ``piece_bytes`` each (:func:`text_pieces`);
- a Parquet file into runs of row groups of about ``piece_bytes`` each (:func:`parquet_pieces`);
- a file its reader does not cut (a DLRM trace, read from one memory-mapped file) is one piece.

A file is identified by its path, size, modification time and a digest of its first and last
MiB (:func:`fingerprint`): cheap on files of 50 GB, and enough to tell a changed file from the
one a saved part was counted from.
"""

from __future__ import annotations

import glob as globbing
import hashlib
import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autoshard.errors import InputError

#: Bytes hashed at each end of a file for its fingerprint.
EDGE_BYTES = 1 << 20
#: Characters that make an input a glob pattern.
GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class Piece:
    """A part of one input file that one worker profiles.

    Args:
        path: The file.
        start: First byte (text), or first row group (Parquet); 0 for a whole file.
        stop: Byte or row group after the last one; -1 for the whole file.
        nbytes: Bytes of the file this piece covers (for progress and throughput).
        file_id: The file's :func:`fingerprint`.
    """

    path: str
    start: int
    stop: int
    nbytes: int
    file_id: str

    @property
    def whole(self) -> bool:
        """Whether the piece is its whole file."""
        return self.stop == -1

    @property
    def label(self) -> str:
        """The file, with the range when the piece is part of it (for messages)."""
        return self.path if self.whole else f"{self.path} [{self.start}:{self.stop}]"

    @property
    def digest(self) -> str:
        """Identifies the piece's content: file fingerprint and range."""
        text = f"{self.file_id}:{self.start}:{self.stop}"
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "start": self.start, "stop": self.stop,
                "nbytes": self.nbytes, "file_id": self.file_id}


def expand_inputs(specs: Iterable[str | Path]) -> list[Path]:
    """The files named by ``specs`` (files, folders, globs), sorted, without repeats.

    Raises:
        InputError: Nothing given, a missing file, an empty folder or a glob matching no file
            (each names the input).
    """
    found: dict[str, Path] = {}
    given = [str(s) for s in specs]
    if not given:
        raise InputError("no input given (name files, folders or globs)", source="command line",
                         field="INPUT")
    for spec in given:
        for path in _expand_one(spec):
            found.setdefault(os.path.realpath(path), path)
    return sorted(found.values(), key=lambda p: str(p))


def _expand_one(spec: str) -> list[Path]:
    path = Path(spec)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise InputError("folder holds no file to profile", source=spec, field="INPUT")
        return files
    if path.is_file():
        return [path]
    if GLOB_CHARS & set(spec):
        files = sorted(Path(p) for p in globbing.glob(spec) if Path(p).is_file())
        if not files:
            raise InputError("glob matches no file", source=spec, field="INPUT")
        return files
    raise InputError("file not found", source=spec, field="INPUT")


def fingerprint(path: Path) -> str:
    """A digest of the file's size, modification time and first and last :data:`EDGE_BYTES`."""
    status = path.stat()
    digest = hashlib.sha256(f"{status.st_size}:{status.st_mtime_ns}".encode())
    try:
        with path.open("rb") as fh:
            digest.update(fh.read(EDGE_BYTES))
            if status.st_size > EDGE_BYTES:
                fh.seek(max(status.st_size - EDGE_BYTES, EDGE_BYTES))
                digest.update(fh.read(EDGE_BYTES))
    except OSError as exc:
        raise InputError(f"cannot read ({exc.strerror or exc})", source=str(path)) from exc
    return digest.hexdigest()[:24]


def text_pieces(path: Path, first: int, piece_bytes: int, file_id: str) -> list[Piece]:
    """Byte ranges of whole lines from byte ``first`` (after a header) of about
    ``piece_bytes`` each; each range starts at the beginning of a line."""
    size = path.stat().st_size
    if size - first <= piece_bytes:
        return [Piece(str(path), 0, -1, size, file_id)]
    cuts = [first]
    with path.open("rb") as fh:
        target = first + piece_bytes
        while target < size:
            fh.seek(target - 1)
            fh.readline()  # the rest of the line that holds byte target - 1
            cut = fh.tell()
            if cut >= size:
                break
            cuts.append(cut)
            target = cut + piece_bytes
    cuts.append(size)
    return [Piece(str(path), a, b, b - a, file_id) for a, b in itertools.pairwise(cuts)]


def parquet_pieces(path: Path, piece_bytes: int, file_id: str) -> list[Piece]:
    """Runs of whole row groups of about ``piece_bytes`` (compressed) each."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as exc:
        raise InputError(f"cannot read Parquet file, truncated or corrupt ({exc})"
                         .splitlines()[0], source=str(path)) from exc
    sizes = [meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)]
    if sum(sizes) <= piece_bytes or len(sizes) <= 1:
        return [Piece(str(path), 0, -1, path.stat().st_size, file_id)]
    pieces, start, total = [], 0, 0
    for group, nbytes in enumerate(sizes):
        total += nbytes
        if total >= piece_bytes or group == len(sizes) - 1:
            pieces.append(Piece(str(path), start, group + 1, total, file_id))
            start, total = group + 1, 0
    return pieces
